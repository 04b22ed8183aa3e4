//! OpenAI's error object over HTTP: the core's [`openai::ApiError`] answered as a response with
//! its status (and `Retry-After` when it has one).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kvgpt_core::openai::{self, Status};

#[derive(Debug)]
pub struct ApiError(pub openai::ApiError);

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError(openai::ApiError::new(Status(status.as_u16()), kind, code, message))
    }

    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError(openai::ApiError::bad(param, message))
    }
}

impl From<openai::ApiError> for ApiError {
    fn from(e: openai::ApiError) -> ApiError {
        ApiError(e)
    }
}

impl std::ops::Deref for ApiError {
    type Target = openai::ApiError;
    fn deref(&self) -> &openai::ApiError {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut openai::ApiError {
        &mut self.0
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", s.into());
        }
        r
    }
}
