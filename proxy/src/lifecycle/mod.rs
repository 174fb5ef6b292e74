//! One request's way through the gateway, in named phases (module `service` lists them).
//! In: a request from `downstream`. Out: its answer, from the upstream (through `call` and
//! the `upstream` clients) or the gateway's own (`answer`, `grpc`).
//!
//! Each request has one context (`ctx::RequestCtx`) that every phase reads and fills.
//! `intake` and `normalize` give the request one authority and one path; `router` picks the
//! route; `policy` authenticates, authorizes and rate-limits; `filters` and `forward` edit
//! the request and answer; `call` sends it upstream (`mirror` sends copies); `body` bounds
//! the request body and counts the answer's; `cost_body` counts rate-limit costs read from
//! the answer's body as it ends; `compress` encodes the upstream's answer for clients that
//! accept it; `grpc_web` translates gRPC-Web calls on GRPCRoutes to gRPC and back.

pub(crate) mod affinity;
pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod cache;
pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod compress;
pub(crate) mod cost_body;
pub(crate) mod ctx;
pub(crate) mod dispatch;
pub(crate) mod ext_auth;
pub mod filters;
pub(crate) mod forward;
pub(crate) mod grpc;
pub(crate) mod grpc_web;
pub(crate) mod intake;
pub(crate) mod mirror;
pub mod normalize;
pub mod policy;
pub(crate) mod refresh;
pub(crate) mod retry;
pub mod router;
pub(crate) mod service;
