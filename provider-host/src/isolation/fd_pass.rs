//! Handing a worker the sockets of new calls: one end of a fresh socket
//! pair travels over the control socket as `SCM_RIGHTS` ancillary data with
//! one byte of payload. No socket is ever named in the file system or the
//! abstract namespace, so nothing but the worker can connect to it.

use nix::{
    errno::Errno,
    sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags},
};
use std::{
    io::{self, IoSlice, IoSliceMut},
    os::{
        fd::{AsRawFd, FromRawFd, RawFd},
        unix::net::UnixStream,
    },
};

/// Sends `socket` over `control`; the caller drops its copy afterwards.
pub fn send_socket(control: &UnixStream, socket: &UnixStream) -> io::Result<()> {
    let fds = [socket.as_raw_fd()];
    let payload = [0u8];
    loop {
        match sendmsg::<()>(
            control.as_raw_fd(),
            &[IoSlice::new(&payload)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => {}
            sent => return Ok(sent.map(drop)?),
        }
    }
}

/// Receives the next socket from `control`; `Ok(None)` when the host
/// closed it.
pub fn receive_socket(control: &UnixStream) -> io::Result<Option<UnixStream>> {
    loop {
        let mut payload = [0u8; 1];
        let mut buffers = [IoSliceMut::new(&mut payload)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let message = match recvmsg::<()>(
            control.as_raw_fd(),
            &mut buffers,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            message => message?,
        };
        if message.bytes == 0 {
            return Ok(None);
        }
        let fd = message.cmsgs().map_err(io::Error::from)?.find_map(|cmsg| match cmsg {
            ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        });
        let fd = fd.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "a control message without a socket")
        })?;
        // SAFETY: the kernel just installed `fd` in this process for this
        // message; nothing else owns it.
        return Ok(Some(unsafe { UnixStream::from_raw_fd(fd) }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_socket_crosses_and_the_end_of_the_control_socket_is_none() {
        let (host, worker) = UnixStream::pair().unwrap();
        let (mut mine, theirs) = UnixStream::pair().unwrap();
        send_socket(&host, &theirs).unwrap();
        drop(theirs);
        let mut received = receive_socket(&worker).unwrap().expect("a socket");
        mine.write_all(b"ping").unwrap();
        let mut word = [0; 4];
        received.read_exact(&mut word).unwrap();
        assert_eq!(&word, b"ping");
        drop(host);
        assert!(receive_socket(&worker).unwrap().is_none());
    }
}
