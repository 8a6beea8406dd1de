//! The one netlink socket: framing, sequence numbers, acks and errors with
//! extended-ack text, multipart dumps restarted when interrupted, size caps
//! and one timeout, for any family.

use super::consts::*;
use super::msg::{messages, ne_u16, ne_u32, parse_error, Msg, MsgRef};
use crate::error::{Error, Result};
use crate::netns::NetNs;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A netlink family: its protocol number and the name errors carry.
pub trait NetlinkFamily {
    const PROTOCOL: isize;
    /// Prefix of every error of this family ("nftables table inet x: …").
    const NAME: &'static str;
    /// `NETLINK_GET_STRICT_CHK`: make the kernel honour dump filters.
    const STRICT_CHECK: bool = false;
}

/// NETLINK_ROUTE: links, addresses, routes, rules.
#[derive(Debug)]
pub struct Route;
impl NetlinkFamily for Route {
    const PROTOCOL: isize = netlink_sys::protocols::NETLINK_ROUTE;
    const NAME: &'static str = "netlink";
    const STRICT_CHECK: bool = true;
}

/// NETLINK_NETFILTER: nf_tables.
#[derive(Debug)]
pub struct Netfilter;
impl NetlinkFamily for Netfilter {
    const PROTOCOL: isize = netlink_sys::protocols::NETLINK_NETFILTER;
    const NAME: &'static str = "nftables";
}

/// NETLINK_XFRM: IPsec policies.
#[derive(Debug)]
pub struct Xfrm;
impl NetlinkFamily for Xfrm {
    const PROTOCOL: isize = netlink_sys::protocols::NETLINK_XFRM;
    const NAME: &'static str = "xfrm";
}

/// How long one request or dump may wait for the kernel. Replies are produced
/// synchronously inside `sendmsg`, so this only fires on real bugs; it exists
/// so a CNI plugin can never hang on netlink.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// How far a receive may overshoot its deadline before the socket's receive
/// timeout is adjusted (a setsockopt) to what is left.
const TIMEOUT_SLACK: Duration = Duration::from_millis(10);
/// The receive buffer, and so the largest datagram accepted: the kernel caps
/// dump skbs at 32 KiB and error replies echo only the header (NETLINK_CAP_ACK),
/// so anything larger means something is badly wrong. One `recv` per
/// datagram, no peek. Reserved, never zeroed: `recv` writes into the spare
/// capacity, so only the pages a reply really fills are ever touched (a
/// zeroed 64 KiB buffer cost 16 page faults and a 64 KiB memset per socket,
/// for an ACK of 36 bytes).
const RECV_BUF_BYTES: usize = 64 * 1024;
/// Upper bound on the total size of a dump [`Socket::dump`] buffers.
pub const MAX_DUMP_BYTES: usize = 64 * 1024 * 1024;
/// How many times to restart a dump that the kernel flagged as inconsistent.
pub const DUMP_ATTEMPTS: u32 = 4;

/// What a dump visitor sees: a row (borrowed from the receive buffer: copy
/// what must outlive the call), or the news that the dump restarted (the
/// kernel flagged it interrupted) and everything seen so far is void.
pub(crate) enum DumpEvent<'a> {
    Restart,
    Row(MsgRef<'a>),
}

/// A netlink socket of family `F`, bound to the network namespace it was
/// created in and usable from any thread.
#[derive(Debug)]
pub struct Socket<F: NetlinkFamily> {
    sock: netlink_sys::Socket,
    port: u32,
    seq: u32,
    buf: Vec<u8>,
    timeout: Duration,
    /// The receive timeout currently set on the socket.
    rcvtimeo: Duration,
    _family: PhantomData<fn() -> F>,
}

fn socket_err<F: NetlinkFamily>(op: &str) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Socket {
        family: F::NAME,
        op: op.to_string(),
        source,
    }
}

impl<F: NetlinkFamily> Socket<F> {
    /// The netns cookie of the namespace this socket is bound to.
    pub fn netns_cookie(&self) -> Result<Option<u64>> {
        // SAFETY: the fd stays open for as long as `self` is borrowed.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.sock.as_raw_fd()) };
        crate::netns::cookie_of(fd)
    }

    /// A socket in the calling thread's namespace.
    pub fn new() -> Result<Self> {
        Self::with_timeout(DEFAULT_TIMEOUT)
    }

    /// A socket bound to `ns` (opened there, usable from any thread).
    pub fn in_netns(ns: &NetNs) -> Result<Self> {
        ns.run(Self::new)?
    }

    /// A socket in the calling thread's namespace whose requests and dumps
    /// each finish within `timeout` or fail with [`Error::Timeout`].
    pub fn with_timeout(timeout: Duration) -> Result<Self> {
        let mut sock = netlink_sys::Socket::new(F::PROTOCOL).map_err(socket_err::<F>("socket"))?;
        let local = sock.bind_auto().map_err(socket_err::<F>("bind"))?;
        // Conveniences (kernel error strings, small error replies, filtered
        // dumps) that old kernels lack; failing to enable them is not fatal.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        if F::STRICT_CHECK {
            let _ = sock.set_netlink_get_strict_chk(true);
        }
        // A zero timeval means "block forever": never pass one.
        let timeout = timeout.max(Duration::from_millis(1));
        set_timeout(&sock, libc::SO_RCVTIMEO, timeout)
            .map_err(socket_err::<F>("setsockopt(SO_RCVTIMEO)"))?;
        set_timeout(&sock, libc::SO_SNDTIMEO, timeout)
            .map_err(socket_err::<F>("setsockopt(SO_SNDTIMEO)"))?;
        // Seed sequence numbers from the clock like libmnl does, so replies to
        // a previous process' socket can never be mistaken for ours.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(Socket {
            sock,
            port: local.port_number(),
            seq,
            buf: Vec::with_capacity(RECV_BUF_BYTES),
            timeout,
            rcvtimeo: timeout,
            _family: PhantomData,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    pub(crate) fn reserve_seqs(&mut self, n: usize) -> u32 {
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(u32::try_from(n).unwrap_or(u32::MAX));
        first
    }

    pub(crate) fn kernel_err(object: &str, errno: i32, message: Option<String>) -> Error {
        Error::Kernel {
            family: F::NAME,
            object: object.to_string(),
            errno,
            message,
        }
    }

    /// The reply of `object` is malformed: `reason` says how (a
    /// [`crate::ParseError`] of the decoders, or what the socket saw).
    pub(crate) fn protocol_err<R: std::fmt::Display>(object: &str) -> impl FnOnce(R) -> Error + '_ {
        move |reason| Error::Protocol {
            family: F::NAME,
            object: object.to_string(),
            reason: reason.to_string(),
        }
    }

    fn timeout_err(&self, object: &str) -> Error {
        Error::Timeout {
            family: F::NAME,
            object: object.to_string(),
            timeout: self.timeout,
        }
    }

    pub(crate) fn send(&self, bytes: &[u8], object: &str) -> Result<()> {
        let kernel = netlink_sys::SocketAddr::new(0, 0);
        let sent = self
            .sock
            .send_to(bytes, &kernel, 0)
            .map_err(socket_err::<F>("sendto"))?;
        if sent != bytes.len() {
            return Err(Self::protocol_err(object)(format!(
                "short send: {sent} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// Receives one datagram and returns its messages that answer `seqs`
    /// (stale answers to an earlier, abandoned request are dropped).
    /// Blocking receives end at `deadline`; non-blocking ones return
    /// `Ok(None)` when the queue is empty.
    pub(crate) fn recv(
        &mut self,
        deadline: Option<Instant>,
        object: &str,
        seqs: impl Fn(u32) -> bool,
    ) -> Result<Option<Vec<Msg>>> {
        let msgs = self.recv_borrowed(deadline, object, seqs)?;
        Ok(msgs.map(|msgs| msgs.into_iter().map(MsgRef::to_owned).collect()))
    }

    /// [`Socket::recv`] without copying: the messages stay in the receive
    /// buffer until the next receive.
    fn recv_borrowed(
        &mut self,
        deadline: Option<Instant>,
        object: &str,
        seqs: impl Fn(u32) -> bool,
    ) -> Result<Option<Vec<MsgRef<'_>>>> {
        let base_flags = if deadline.is_none() {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        loop {
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.timeout_err(object));
                }
                // Keep the socket's receive timeout within SLACK of what is
                // left: shortened near a deadline (never on a healthy
                // kernel), restored for the next request; the common path
                // makes no extra syscall.
                let want = left.min(self.timeout);
                if want + TIMEOUT_SLACK < self.rcvtimeo || want > self.rcvtimeo + TIMEOUT_SLACK {
                    set_timeout(&self.sock, libc::SO_RCVTIMEO, want)
                        .map_err(socket_err::<F>("setsockopt(SO_RCVTIMEO)"))?;
                    self.rcvtimeo = want;
                }
            }
            // Into the spare capacity (netlink-sys sets the length to what
            // the kernel wrote, at most the capacity, even with MSG_TRUNC).
            self.buf.clear();
            let got = self.sock.recv(&mut self.buf, base_flags | libc::MSG_TRUNC);
            let got = match got {
                Ok(size) => size,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return match deadline {
                        None => Ok(None),
                        Some(_) => Err(self.timeout_err(object)),
                    };
                }
                Err(e) => return Err(socket_err::<F>("recv")(e)),
            };
            if got > self.buf.len() {
                // MSG_TRUNC reports the real size: the datagram did not fit
                // and is gone (the socket stays usable).
                return Err(Error::TooLarge {
                    family: F::NAME,
                    object: object.to_string(),
                    size: got,
                    limit: self.buf.capacity(),
                });
            }
            let msgs = messages(self.buf.as_slice()).map_err(Self::protocol_err(object))?;
            return Ok(Some(ours(msgs, seqs, self.port)));
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Sends one request (sequence `seq`) and returns the data messages that
    /// precede its ACK, or the kernel's error. A request without `NLM_F_ACK`
    /// (a GET) ends with its first answer.
    pub(crate) fn request(&mut self, bytes: &[u8], seq: u32, object: &str) -> Result<Vec<Msg>> {
        let ack = ne_u16(bytes, 6).is_none_or(|flags| flags & NLM_F_ACK != 0);
        self.send(bytes, object)?;
        let deadline = self.deadline();
        let mut rows = Vec::new();
        loop {
            let msgs = self
                .recv(Some(deadline), object, |s| s == seq)?
                .unwrap_or_default();
            for msg in msgs {
                match msg.ty {
                    NLMSG_ERROR => {
                        let (errno, message) =
                            parse_error(msg.view()).map_err(Self::protocol_err(object))?;
                        return match errno {
                            0 => Ok(rows),
                            _ => Err(Self::kernel_err(object, errno, message)),
                        };
                    }
                    NLMSG_DONE | NLMSG_NOOP => {}
                    NLMSG_OVERRUN => return Err(Self::protocol_err(object)("NLMSG_OVERRUN")),
                    _ => {
                        rows.push(msg);
                        if !ack {
                            return Ok(rows);
                        }
                    }
                }
            }
        }
    }

    /// Runs a dump, handing each row to `visit`, restarting it (and telling
    /// `visit` so) if the kernel reports that the objects changed underneath
    /// it (`NLM_F_DUMP_INTR`). `build(seq)` encodes the request.
    ///
    /// A dump is always read to its end (unless the kernel errs) so the
    /// socket is never left with a half-finished dump, which would make the
    /// next one fail with EBUSY; the first error of `visit` is returned then.
    pub(crate) fn dump_each(
        &mut self,
        object: &str,
        build: impl Fn(u32) -> Vec<u8>,
        mut visit: impl FnMut(DumpEvent<'_>) -> Result<()>,
    ) -> Result<()> {
        // One deadline for every attempt: the caller's budget is the total.
        let deadline = self.deadline();
        for attempt in 0..DUMP_ATTEMPTS {
            if attempt > 0 {
                visit(DumpEvent::Restart)?;
            }
            let seq = self.next_seq();
            self.send(&build(seq), object)?;
            let mut interrupted = false;
            let mut failed: Option<Error> = None;
            loop {
                let msgs = self
                    .recv_borrowed(Some(deadline), object, |s| s == seq)?
                    .unwrap_or_default();
                let done = dump_step::<F>(msgs, object, &mut interrupted, |msg| {
                    if failed.is_none() {
                        if let Err(e) = visit(DumpEvent::Row(msg)) {
                            failed = Some(e);
                        }
                    }
                })?;
                if done {
                    break;
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            if !interrupted {
                return Ok(());
            }
        }
        Err(Error::DumpInterrupted {
            family: F::NAME,
            object: object.to_string(),
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// [`Socket::dump_each`] collecting the rows, at most
    /// [`MAX_DUMP_BYTES`] of them.
    pub(crate) fn dump(
        &mut self,
        object: &str,
        build: impl Fn(u32) -> Vec<u8>,
    ) -> Result<Vec<Msg>> {
        self.dump_map(object, build, |msg| Ok(Some(msg.to_owned())))
    }

    /// [`Socket::dump_each`] collecting what `map` makes of each row
    /// (`None`: nothing), read in place; at most [`MAX_DUMP_BYTES`] of
    /// rows are visited.
    pub(crate) fn dump_map<T>(
        &mut self,
        object: &str,
        build: impl Fn(u32) -> Vec<u8>,
        mut map: impl FnMut(MsgRef<'_>) -> Result<Option<T>>,
    ) -> Result<Vec<T>> {
        let mut rows = Vec::new();
        let mut total = 0usize;
        self.dump_each(object, build, |event| {
            match event {
                DumpEvent::Restart => {
                    rows.clear();
                    total = 0;
                }
                DumpEvent::Row(msg) => {
                    total = total.saturating_add(msg.payload.len());
                    if total > MAX_DUMP_BYTES {
                        return Err(Error::TooLarge {
                            family: F::NAME,
                            object: object.to_string(),
                            size: total,
                            limit: MAX_DUMP_BYTES,
                        });
                    }
                    if let Some(row) = map(msg)? {
                        rows.push(row);
                    }
                }
            }
            Ok(())
        })?;
        Ok(rows)
    }

    /// Sends a batch of messages numbered `first..=last` and waits for its
    /// outcome: the ACK of `last`, or the first error (later ones are usually
    /// consequences of the aborted transaction). `object(seq)` names what a
    /// sequence number refers to.
    ///
    /// The kernel processes a batch synchronously inside `sendmsg`, so all
    /// replies are queued once `send` returns. We block for the final ACK;
    /// as soon as an error shows up we only drain what is already queued,
    /// which also covers batch-level failures that produce no final ACK.
    pub(crate) fn batch(
        &mut self,
        bytes: &[u8],
        contains: impl Fn(u32) -> bool,
        last: u32,
        whole: &str,
        object: impl Fn(u32) -> String,
    ) -> Result<()> {
        self.send(bytes, whole)?;
        let deadline = self.deadline();
        let mut errors: Vec<Error> = Vec::new();
        let mut done = false;
        while !done {
            let wait = errors.is_empty().then_some(deadline);
            let Some(msgs) = self.recv(wait, whole, &contains)? else {
                break; // drained after an error
            };
            for msg in msgs {
                match msg.ty {
                    NLMSG_ERROR => {
                        let (errno, message) =
                            parse_error(msg.view()).map_err(Self::protocol_err(whole))?;
                        if errno != 0 {
                            errors.push(Self::kernel_err(&object(msg.seq), errno, message));
                        } else if msg.seq == last {
                            done = true;
                        }
                    }
                    NLMSG_OVERRUN => return Err(Self::protocol_err(whole)("NLMSG_OVERRUN")),
                    _ => {}
                }
            }
        }
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The messages of a datagram that answer one of `seqs` on `port`: a stale
/// answer to an earlier, abandoned request, or one for another socket, is
/// dropped.
pub(crate) fn ours<'a>(
    msgs: Vec<MsgRef<'a>>,
    seqs: impl Fn(u32) -> bool,
    port: u32,
) -> Vec<MsgRef<'a>> {
    msgs.into_iter()
        .filter(|m| seqs(m.seq) && (m.port == 0 || m.port == port))
        .collect()
}

/// One datagram of a dump (already filtered by [`ours`]): rows go to `row`,
/// `NLM_F_DUMP_INTR` is noted in `interrupted`; returns whether the dump is
/// complete (`NLMSG_DONE`), or the kernel's error.
pub(crate) fn dump_step<'a, F: NetlinkFamily>(
    msgs: Vec<MsgRef<'a>>,
    object: &str,
    interrupted: &mut bool,
    mut row: impl FnMut(MsgRef<'a>),
) -> Result<bool> {
    for msg in msgs {
        *interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
        match msg.ty {
            NLMSG_DONE => {
                // NLMSG_DONE carries the dump's final status.
                let status = ne_u32(msg.payload, 0).map(|v| i32::from_ne_bytes(v.to_ne_bytes()));
                if let Some(status) = status.filter(|s| *s < 0) {
                    return Err(Socket::<F>::kernel_err(
                        object,
                        status.saturating_neg(),
                        None,
                    ));
                }
                return Ok(true);
            }
            NLMSG_ERROR => {
                let (errno, message) =
                    parse_error(msg).map_err(Socket::<F>::protocol_err(object))?;
                if errno != 0 {
                    return Err(Socket::<F>::kernel_err(object, errno, message));
                }
            }
            NLMSG_NOOP => {}
            NLMSG_OVERRUN => return Err(Socket::<F>::protocol_err(object)("NLMSG_OVERRUN")),
            _ => row(msg),
        }
    }
    Ok(false)
}

fn set_timeout(sock: &netlink_sys::Socket, opt: libc::c_int, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    // SAFETY: `tv` is a valid timeval that outlives the call, and the length
    // passed matches its size; the fd is owned by `sock`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::addr_of!(tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, flags: u16, seq: u32, port: u32, payload: &[u8]) -> MsgRef<'_> {
        MsgRef {
            ty,
            flags,
            seq,
            port,
            payload,
        }
    }

    #[test]
    fn ours_filters_by_sequence_and_port() {
        let msgs = vec![
            msg(20, 0, 7, 42, &[]),
            msg(20, 0, 6, 42, &[]), // stale sequence
            msg(20, 0, 7, 43, &[]), // another socket
            msg(20, 0, 7, 0, &[]),  // from the kernel, no port
        ];
        let kept = ours(msgs, |s| s == 7, 42);
        assert_eq!(kept.iter().map(|m| m.port).collect::<Vec<_>>(), vec![42, 0]);
    }

    #[test]
    fn dump_step_rows_interrupt_done_and_errors() {
        let mut interrupted = false;
        let mut rows = Vec::new();
        let done = dump_step::<Route>(
            vec![
                msg(24, NLM_F_MULTI, 1, 0, &[1]),
                msg(24, NLM_F_MULTI | NLM_F_DUMP_INTR, 1, 0, &[2]),
            ],
            "list routes",
            &mut interrupted,
            |m| rows.push(m.payload.to_vec()),
        )
        .unwrap();
        assert!(!done && interrupted);
        assert_eq!(rows, vec![vec![1], vec![2]]);

        let mut interrupted = false;
        let done = dump_step::<Route>(
            vec![msg(NLMSG_DONE, NLM_F_MULTI, 1, 0, &0i32.to_ne_bytes())],
            "list routes",
            &mut interrupted,
            |_| panic!("no rows"),
        )
        .unwrap();
        assert!(done && !interrupted);

        // A negative status in NLMSG_DONE and an error reply are kernel errors.
        for m in [
            msg(NLMSG_DONE, 0, 1, 0, &(-libc::EBUSY).to_ne_bytes()),
            msg(NLMSG_ERROR, 0, 1, 0, &(-libc::EBUSY).to_ne_bytes()),
        ] {
            let err = dump_step::<Netfilter>(vec![m], "list chains", &mut interrupted, |_| {})
                .unwrap_err();
            assert_eq!(err.errno(), Some(libc::EBUSY));
            assert!(
                err.to_string()
                    .starts_with("nftables list chains: kernel returned EBUSY"),
                "{err}"
            );
        }
        let err = dump_step::<Xfrm>(
            vec![msg(NLMSG_OVERRUN, 0, 1, 0, &[])],
            "policy dump",
            &mut interrupted,
            |_| {},
        )
        .unwrap_err();
        assert!(matches!(err, Error::Protocol { .. }), "{err}");
    }

    #[test]
    fn requests_and_dumps_against_the_kernel() {
        // Read-only, in a throwaway netns of a thread of its own (root): a
        // link dump and a GETLINK of an index that does not exist.
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            kernel_round_trips();
        })
        .join()
        .unwrap();
    }

    fn getlink(seq: u32, flags: u16, index: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&18u16.to_ne_bytes()); // RTM_GETLINK
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        let mut ifi = [0u8; 16];
        ifi[4..8].copy_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&ifi);
        m
    }

    #[test]
    fn unanswered_request_times_out_and_the_socket_recovers() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let timeout = Duration::from_millis(200);
            let mut s = Socket::<Route>::with_timeout(timeout).unwrap();
            // Without NLM_F_REQUEST the kernel ignores a message: no answer.
            let seq = s.next_seq();
            let started = Instant::now();
            let err = s.request(&getlink(seq, 0, 1), seq, "get link").unwrap_err();
            assert!(matches!(err, Error::Timeout { .. }), "{err}");
            assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
            assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
            // The next request gets its full timeout again and an answer.
            let seq = s.next_seq();
            let rows = s
                .request(&getlink(seq, NLM_F_REQUEST | NLM_F_ACK, 1), seq, "get lo")
                .unwrap();
            assert_eq!(rows.len(), 1);
        })
        .join()
        .unwrap();
    }

    fn kernel_round_trips() {
        let mut s = Socket::<Route>::new().unwrap();
        let dump = |seq: u32| {
            let mut m = Vec::new();
            m.extend_from_slice(&32u32.to_ne_bytes());
            m.extend_from_slice(&18u16.to_ne_bytes()); // RTM_GETLINK
            m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(&[0u8; 16]); // ifinfomsg, any family
            m
        };
        let rows = s.dump("list links", dump).unwrap();
        assert!(!rows.is_empty());
        // A request for an index that does not exist: the kernel's ENODEV.
        let seq = s.next_seq();
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&18u16.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        let mut ifi = [0u8; 16];
        ifi[4..8].copy_from_slice(&i32::MAX.to_ne_bytes());
        m.extend_from_slice(&ifi);
        let err = s.request(&m, seq, "get link").unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(
            err.to_string()
                .starts_with("netlink get link: kernel returned ENODEV"),
            "{err}"
        );
    }
}
