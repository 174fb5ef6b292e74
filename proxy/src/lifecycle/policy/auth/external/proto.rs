//! The messages of Envoy's `envoy.service.auth.v3.Authorization/Check`, hand-written for
//! prost with the field numbers of the published protos (no protoc at build time):
//!
//! - `envoy/service/auth/v3/external_auth.proto`: CheckRequest, CheckResponse,
//!   OkHttpResponse, DeniedHttpResponse;
//! - `envoy/service/auth/v3/attribute_context.proto`: AttributeContext, its Peer, Request and
//!   HttpRequest;
//! - `envoy/config/core/v3/base.proto`: HeaderValue, HeaderValueOption;
//!   `envoy/config/core/v3/address.proto`: Address, SocketAddress;
//! - `envoy/type/v3/http_status.proto`: HttpStatus; `google/rpc/status.proto`: Status.
//!
//! (checked against go-control-plane/envoy v1.40.0's generated code). Only the fields the
//! gateway sends or reads are declared; prost skips unknown ones, as protobuf requires.

use std::collections::HashMap;

/// `envoy.service.auth.v3.CheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckRequest {
    /// The request attributes.
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<AttributeContext>,
}

/// `envoy.service.auth.v3.AttributeContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeContext {
    /// The client.
    #[prost(message, optional, tag = "1")]
    pub source: Option<Peer>,
    /// The request.
    #[prost(message, optional, tag = "4")]
    pub request: Option<Request>,
}

/// `AttributeContext.Peer`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Peer {
    /// `envoy.config.core.v3.Address`.
    #[prost(message, optional, tag = "1")]
    pub address: Option<Address>,
}

/// `envoy.config.core.v3.Address` (the `socket_address` arm of its oneof).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    /// `socket_address`.
    #[prost(message, optional, tag = "1")]
    pub socket_address: Option<SocketAddress>,
}

/// `envoy.config.core.v3.SocketAddress`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SocketAddress {
    /// The IP.
    #[prost(string, tag = "2")]
    pub address: String,
    /// `port_value` (of the `port_specifier` oneof).
    #[prost(uint32, tag = "3")]
    pub port_value: u32,
}

/// `AttributeContext.Request`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    /// The HTTP request.
    #[prost(message, optional, tag = "2")]
    pub http: Option<HttpRequest>,
}

/// `AttributeContext.HttpRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpRequest {
    /// The request id.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The method.
    #[prost(string, tag = "2")]
    pub method: String,
    /// Lower-case names; repeated fields joined by `,`.
    #[prost(map = "string, string", tag = "3")]
    pub headers: HashMap<String, String>,
    /// Path with query.
    #[prost(string, tag = "4")]
    pub path: String,
    /// The host.
    #[prost(string, tag = "5")]
    pub host: String,
    /// `http` or `https`.
    #[prost(string, tag = "6")]
    pub scheme: String,
    /// The body length, or -1 when unknown.
    #[prost(int64, tag = "9")]
    pub size: i64,
    /// `HTTP/1.1`, `HTTP/2`.
    #[prost(string, tag = "10")]
    pub protocol: String,
    /// The body, as UTF-8 (only when it is).
    #[prost(string, tag = "11")]
    pub body: String,
    /// The body, as bytes.
    #[prost(bytes = "vec", tag = "12")]
    pub raw_body: Vec<u8>,
}

/// `envoy.service.auth.v3.CheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckResponse {
    /// `google.rpc.Status`: code 0 allows.
    #[prost(message, optional, tag = "1")]
    pub status: Option<RpcStatus>,
    /// `denied_response` of the `http_response` oneof.
    #[prost(message, optional, tag = "2")]
    pub denied_response: Option<DeniedHttpResponse>,
    /// `ok_response` of the `http_response` oneof.
    #[prost(message, optional, tag = "3")]
    pub ok_response: Option<OkHttpResponse>,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// A `google.rpc.Code`.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// A developer-facing message.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `envoy.service.auth.v3.DeniedHttpResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeniedHttpResponse {
    /// `envoy.type.v3.HttpStatus`.
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    /// Headers for the client.
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    /// The body for the client.
    #[prost(string, tag = "3")]
    pub body: String,
}

/// `envoy.service.auth.v3.OkHttpResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OkHttpResponse {
    /// Headers set on the upstream request.
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    /// Headers removed from the upstream request.
    #[prost(string, repeated, tag = "5")]
    pub headers_to_remove: Vec<String>,
    /// Headers added to the client's response.
    #[prost(message, repeated, tag = "6")]
    pub response_headers_to_add: Vec<HeaderValueOption>,
}

/// `envoy.type.v3.HttpStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    /// `envoy.type.v3.StatusCode`, numerically the HTTP status.
    #[prost(int32, tag = "1")]
    pub code: i32,
}

/// `envoy.config.core.v3.HeaderValueOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    /// The header.
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    /// `append` (a `google.protobuf.BoolValue`): append rather than replace.
    #[prost(message, optional, tag = "2")]
    pub append: Option<BoolValue>,
}

/// `google.protobuf.BoolValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    /// The value.
    #[prost(bool, tag = "1")]
    pub value: bool,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    /// Name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value as text.
    #[prost(string, tag = "2")]
    pub value: String,
    /// Value as bytes (takes precedence when set).
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}
