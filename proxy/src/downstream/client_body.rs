//! A request body as the client sends it. In: hyper's HTTP/2 stream body, or our HTTP/1
//! server's (module `h1serve`, streamed off the client's connection). Out: one [`Body`] the
//! lifecycle bounds (`body::LimitedBody`) and forwards.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::error::BoxError;

/// A request body as the client sends it: hyper's (HTTP/2), our HTTP/1 server's (module
/// `h1serve`, streamed off the client's connection), or none.
#[derive(Debug)]
pub(crate) enum ClientBody {
    Hyper(Incoming),
    H1(crate::downstream::h1_body::RequestBody),
    /// Read whole before the upstream call (an external authorization rule forwards it);
    /// `None` once sent.
    Held(Option<Bytes>),
    /// A gRPC-Web call's body, decoded and checked on its way to a gRPC backend.
    GrpcWeb(Box<crate::lifecycle::grpc_web::decode::RequestBody<ClientBody>>),
    Empty,
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Hyper(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Self::H1(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Self::Held(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Self::GrpcWeb(b) => Pin::new(&mut **b).poll_frame(cx),
            Self::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper(b) => b.is_end_stream(),
            Self::H1(b) => b.is_end_stream(),
            Self::Held(b) => b.as_ref().is_none_or(Bytes::is_empty),
            Self::GrpcWeb(b) => b.is_end_stream(),
            Self::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Hyper(b) => b.size_hint(),
            Self::H1(b) => b.size_hint(),
            Self::Held(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Self::GrpcWeb(b) => b.size_hint(),
            Self::Empty => SizeHint::with_exact(0),
        }
    }
}
