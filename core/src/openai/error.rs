//! OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`) with the HTTP status
//! it goes out with: what a request that cannot be served is answered with, over HTTP by the
//! server and as an exception by the Python package.

use serde_json::{json, Value};

/// An HTTP status code, as a number (the server maps it onto its HTTP library's type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const BAD_REQUEST: Status = Status(400);
    pub const NOT_FOUND: Status = Status(404);
    pub const INTERNAL_SERVER_ERROR: Status = Status(500);
    pub const SERVICE_UNAVAILABLE: Status = Status(503);

    pub fn as_u16(self) -> u16 {
        self.0
    }

    /// 4xx: the request was wrong, not the server.
    pub fn is_client_error(self) -> bool {
        (400..500).contains(&self.0)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An error answered as OpenAI's error object.
#[derive(Debug)]
pub struct ApiError {
    pub status: Status,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again (503s).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 `invalid_request_error`, naming the field `param` (none when empty).
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: Status::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: (!param.is_empty()).then(|| param.to_string()),
            code: None,
            retry_after: None,
        }
    }

    pub fn new(status: Status, kind: &'static str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: Some(code), retry_after: None }
    }

    /// The engine failed a sequence (500 `engine_error`).
    pub fn engine(message: impl Into<String>) -> ApiError {
        ApiError::new(Status::INTERNAL_SERVER_ERROR, "server_error", "engine_error", message)
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

pub type ApiResult<T> = Result<T, ApiError>;
