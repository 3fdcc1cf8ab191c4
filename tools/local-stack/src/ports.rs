//! Every port is checked before anything starts, so a port in use fails fast and says which.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener as StdListener};

use tokio::net::TcpListener;

use crate::Error;

/// Binds the port for one of our own servers and keeps it (0: a free port).
pub(crate) async fn bind(port: u16, what: &'static str, flag: &'static str) -> Result<TcpListener, Error> {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
        .await
        .map_err(|e| crate::port_error(e, port, what, flag))
}

/// Checks that a port another process will bind is free now.
pub(crate) fn check(port: u16, what: &'static str, flag: &'static str) -> Result<(), Error> {
    StdListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
        .map(drop)
        .map_err(|e| crate::port_error(e, port, what, flag))?;
    // On some systems (macOS) a process listening on every interface does not stop a bind to
    // 127.0.0.1; a connection attempt finds it.
    if std::net::TcpStream::connect_timeout(
        &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into(),
        std::time::Duration::from_millis(200),
    )
    .is_ok()
    {
        return Err(Error::PortInUse { port, what, flag });
    }
    Ok(())
}

/// A port that is free now (for a process that binds it shortly after).
pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = StdListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .map_err(|source| Error::Io { what: "finding a free port".into(), source })?;
    listener.local_addr().map(|a| a.port()).map_err(|source| Error::Io { what: "finding a free port".into(), source })
}
