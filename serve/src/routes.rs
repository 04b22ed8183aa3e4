//! The routes, from `http::ROUTES` (the one table of paths and methods), and the two completion
//! handlers: admission, then one JSON answer or a stream.

use super::http::{self, Shared};
use super::{access, admission, responses, worker};
use axum::body::Body;
use axum::extract::State;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use kvgpt_core::openai::Endpoint;
use std::sync::Arc;

/// Every route with its handler, behind the access checks.
pub fn router(app: Shared) -> Router {
    let mut router = Router::new();
    router = route(router, "/health", http::health);
    router = route(router, "/v1/models", http::models);
    router = route(router, "/v1/completions", completions);
    router = route(router, "/v1/chat/completions", chat_completions);
    router = route(router, "/tokenize", http::tokenize);
    router = route(router, "/detokenize", http::detokenize);
    router = route(router, "/metrics", http::metrics_text);
    router = route(router, "/server_info", worker::server_info);
    router = route(router, "/get_server_info", worker::server_info);
    router = route(router, "/model_info", worker::model_info);
    router = route(router, "/get_model_info", worker::model_info);
    router = route(router, "/get_load", worker::load);
    router = route(router, "/kv_event_sources", worker::kv_event_sources);
    router = route(router, "/flush_cache", worker::flush_cache);
    router = route(router, "/v1/completions/render", worker::render_completion);
    router = route(router, "/v1/chat/completions/render", worker::render_chat);
    router
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), access::front))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(app)
}

/// Adds `path` with `handler`, for the method `http::ROUTES` gives it (the one table of routes).
fn route<H, T>(router: Router<Shared>, path: &'static str, handler: H) -> Router<Shared>
where
    H: axum::handler::Handler<T, Shared>,
    T: 'static,
{
    let method = http::method_of(path).unwrap_or_else(|| panic!("{path} is not in http::ROUTES"));
    // get() answers HEAD too, as HTTP asks of a GET.
    let handler =
        if method == axum::http::Method::POST { axum::routing::post(handler) } else { axum::routing::get(handler) };
    router.route(path, handler)
}

type TallyOf = Extension<Arc<access::Tally>>;

async fn completions(State(app): State<Shared>, Extension(tally): TallyOf, body: Body) -> Response {
    respond(app, tally, body, Endpoint::Completions).await
}

async fn chat_completions(State(app): State<Shared>, Extension(tally): TallyOf, body: Body) -> Response {
    respond(app, tally, body, Endpoint::Chat).await
}

async fn respond(app: Shared, tally: Arc<access::Tally>, body: Body, ep: Endpoint) -> Response {
    if let Err(e) = app.accepting() {
        http::drain(&app, body).await;
        return e.into_response();
    }
    let out = match admission::start(&app, body, ep, tally).await {
        Ok(job) if job.job.head.params.stream => Ok(responses::stream(app.clone(), job)),
        Ok(job) => responses::collect(&app, job).await.map(|v| Json(v).into_response()),
        Err(e) => Err(e),
    };
    out.unwrap_or_else(|e| e.into_response())
}
