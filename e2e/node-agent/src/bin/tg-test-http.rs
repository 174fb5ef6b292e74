//! A tiny HTTP/1.1 server for the node agent's tests: answers every request with 200 and
//! `hello from <HOSTNAME>` (the pod name). Listens on 0.0.0.0:$PORT (default 8080).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let name = std::env::var("HOSTNAME").unwrap_or_default();
    let listener = TcpListener::bind(("0.0.0.0", port)).await?;
    println!("listening on 0.0.0.0:{port}");
    loop {
        let (mut s, _) = listener.accept().await?;
        let body = format!("hello from {name}\n");
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        });
    }
}
