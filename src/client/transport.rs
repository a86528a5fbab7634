//! The client's byte stream (plain TCP or rustls over TCP) and the wait used by
//! subscriptions to sleep until the socket is readable or a cancel arrives.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// A connected byte stream.
pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Transport {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => &s.sock,
        }
    }

    /// True when the TLS layer already holds decrypted bytes, so a read would not touch the
    /// socket. Always false for plain TCP.
    pub(crate) fn has_buffered_plaintext(&mut self) -> bool {
        match self {
            Transport::Plain(_) => false,
            // On a TLS error, report "ready" so the next read surfaces it.
            Transport::Tls(s) => s.conn.process_new_packets().map_or(true, |st| st.plaintext_bytes_to_read() > 0),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.write_all(buf),
            Transport::Tls(s) => s.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// What [`wait_readable`] saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The socket is readable (or closed / in error: a read will tell).
    Socket,
    /// The wake descriptor fired.
    Wake,
}

/// Blocks until `sock` is readable or `wake` is, with an optional timeout
/// (`Err(TimedOut)` when it passes). The wake descriptor wins a tie.
pub(crate) fn wait_readable(sock: RawFd, wake: RawFd, timeout: Option<Duration>) -> io::Result<Woken> {
    let mut fds = [libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 }, libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 }];
    let ms: libc::c_int = match timeout {
        None => -1,
        Some(d) => d.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int,
    };
    loop {
        // SAFETY: `fds` is a valid, exclusively borrowed array of two pollfd structs for the
        // duration of the call, and the count passed matches its length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out waiting for the server"));
        }
        if fds[1].revents != 0 {
            return Ok(Woken::Wake);
        }
        return Ok(Woken::Socket);
    }
}

/// Raw descriptor of a transport's socket.
pub(crate) fn raw_fd(t: &Transport) -> RawFd {
    t.tcp().as_raw_fd()
}
