//! The bootstrap exchange: how a client and a memory-node daemon swap what
//! their queue pairs need before any verb can flow.
//!
//! Over one TCP connection per (client, node), the client sends a
//! [`Hello`] with its queue pair's endpoint; the daemon answers with a
//! [`Welcome`] (its own endpoint and the region's address, key and size) or
//! a [`Reject`] saying why, then keeps the connection open for as long as
//! the queue pair lives: the client closing it is how the daemon learns to
//! tear the queue pair down.
//!
//! Every message is one frame:
//!
//! ```text
//! bytes 0..4    magic "SWRM"
//!       4..6    protocol version, little endian (VERSION)
//!       6       kind: 1 hello, 2 welcome, 3 reject
//!       7       reserved, 0
//!       8..12   body length, little endian, at most MAX_BODY
//!       12..    body (fixed layout per kind; see the encoders)
//! ```
//!
//! The daemon reads frames from anyone who can reach its port, so decoding
//! treats every byte as hostile: lengths are checked against [`MAX_BODY`]
//! before anything is read, bodies must have exactly their kind's size,
//! strings must be UTF-8 and short, and queue-pair numbers must fit their
//! 24 bits. A bad frame is an [`BootError`], never a panic.

use core::fmt;
use std::io::{self, Read, Write};

/// "SWRM".
pub const MAGIC: [u8; 4] = *b"SWRM";
/// The version this build speaks; a peer speaking another is refused.
pub const VERSION: u16 = 2;
/// Bytes of a frame header.
pub const HEADER: usize = 12;
/// The largest body any kind has (a hello with its longest label).
pub const MAX_BODY: usize = ENDPOINT + 2 + MAX_TEXT;
/// The longest client label or reject reason, in bytes.
pub const MAX_TEXT: usize = 256;

const KIND_HELLO: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_REJECT: u8 = 3;

/// Bytes of an encoded [`Endpoint`].
const ENDPOINT: usize = 2 + 4 + 4 + 16 + 1 + 1;
/// Bytes of a welcome body.
const WELCOME: usize = ENDPOINT + 8 + 4 + 8;

/// What a queue pair's peer needs to connect to it (RC, `ibv_modify_qp` to
/// RTR and RTS): its LID (InfiniBand), GID (RoCE), queue pair number and
/// first packet sequence number, and the two limits both ends must agree
/// on: the path MTU (the smaller port's) and how many READs and atomics
/// may be outstanding (no more than the responder takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Local identifier of the port (0 on RoCE).
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// Global identifier (RoCE, or InfiniBand across subnets); zero if unused.
    pub gid: [u8; 16],
    /// The port's active MTU, as `enum ibv_mtu`: 1 (256 B) to 5 (4096 B).
    pub mtu: u8,
    /// RDMA READs and atomics this end takes or issues at once (at least 1).
    pub rd_atomic: u8,
}

impl Default for Endpoint {
    /// Zero addresses, a 1024-byte MTU, one READ or atomic at a time.
    fn default() -> Self {
        Endpoint { lid: 0, qpn: 0, psn: 0, gid: [0; 16], mtu: 3, rd_atomic: 1 }
    }
}

/// The client's opening message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The client's queue pair for this node.
    pub endpoint: Endpoint,
    /// Who the client is, for the daemon's log (host and process, say).
    pub label: String,
}

/// The daemon's answer to a good [`Hello`]: its queue pair and region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The daemon's queue pair for this client.
    pub endpoint: Endpoint,
    /// Virtual address of the region's first byte (for the work requests).
    pub addr: u64,
    /// Remote key of the region.
    pub rkey: u32,
    /// Bytes in the region.
    pub size: u64,
}

/// The daemon's answer to a hello it will not serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    /// Why, in words for a person.
    pub reason: String,
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client to daemon.
    Hello(Hello),
    /// Daemon to client: accepted.
    Welcome(Welcome),
    /// Daemon to client: refused.
    Reject(Reject),
}

/// Why bytes are not a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootError {
    /// The stream ended (or the input stopped) inside a frame.
    Truncated {
        /// Bytes a complete frame needs.
        need: usize,
        /// Bytes there were.
        got: usize,
    },
    /// The first four bytes are not "SWRM": not a SWARM client at all.
    BadMagic([u8; 4]),
    /// A version this build does not speak.
    Version(u16),
    /// A kind that is not hello, welcome or reject.
    Kind(u8),
    /// The reserved byte is not zero.
    Reserved(u8),
    /// A body longer than [`MAX_BODY`], refused before reading it.
    TooLong(u32),
    /// A body of the wrong size for its kind.
    BodySize {
        /// The kind.
        kind: u8,
        /// Bytes its layout needs.
        want: usize,
        /// Bytes the header announced.
        got: usize,
    },
    /// A field with an impossible value.
    Field(&'static str),
    /// Reading or writing the connection failed (a time-out included).
    Io(io::ErrorKind),
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::Truncated { need, got } => write!(f, "truncated frame: {got} of {need} bytes"),
            BootError::BadMagic(m) => write!(f, "not a SWARM bootstrap frame (magic {m:02x?})"),
            BootError::Version(v) => write!(f, "protocol version {v} is not supported (this build speaks {VERSION})"),
            BootError::Kind(k) => write!(f, "unknown message kind {k}"),
            BootError::Reserved(r) => write!(f, "reserved byte is {r}, not 0"),
            BootError::TooLong(n) => write!(f, "body of {n} bytes is longer than the limit of {MAX_BODY}"),
            BootError::BodySize { kind, want, got } => {
                write!(f, "message kind {kind} has a body of {got} bytes, not {want}")
            }
            BootError::Field(what) => write!(f, "invalid {what}"),
            BootError::Io(kind) => write!(f, "connection: {}", io::Error::from(*kind)),
        }
    }
}

impl std::error::Error for BootError {}

impl From<io::Error> for BootError {
    fn from(e: io::Error) -> Self {
        BootError::Io(e.kind())
    }
}

impl Endpoint {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&[self.mtu, self.rd_atomic]);
    }

    fn decode(r: &mut Fields<'_>) -> Result<Endpoint, BootError> {
        let lid = r.u16();
        let qpn = r.u32();
        let psn = r.u32();
        let gid = r.array::<16>();
        let [mtu, rd_atomic] = r.array::<2>();
        if !(1..=5).contains(&mtu) {
            return Err(BootError::Field("path MTU (not 1 to 5)"));
        }
        if rd_atomic == 0 {
            return Err(BootError::Field("outstanding READs and atomics (zero)"));
        }
        if qpn >= 1 << 24 {
            return Err(BootError::Field("queue pair number (more than 24 bits)"));
        }
        if psn >= 1 << 24 {
            return Err(BootError::Field("packet sequence number (more than 24 bits)"));
        }
        Ok(Endpoint { lid, qpn, psn, gid, mtu, rd_atomic })
    }
}

impl Message {
    /// The frame of this message. Texts longer than [`MAX_TEXT`] bytes are
    /// cut at a character boundary.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(MAX_BODY);
        let kind = match self {
            Message::Hello(h) => {
                h.endpoint.encode(&mut body);
                put_text(&mut body, &h.label);
                KIND_HELLO
            }
            Message::Welcome(w) => {
                w.endpoint.encode(&mut body);
                body.extend_from_slice(&w.addr.to_le_bytes());
                body.extend_from_slice(&w.rkey.to_le_bytes());
                body.extend_from_slice(&w.size.to_le_bytes());
                KIND_WELCOME
            }
            Message::Reject(r) => {
                put_text(&mut body, &r.reason);
                KIND_REJECT
            }
        };
        let mut frame = Vec::with_capacity(HEADER + body.len());
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&VERSION.to_le_bytes());
        frame.push(kind);
        frame.push(0);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        frame
    }

    /// Decodes one whole frame (and nothing after it).
    pub fn decode(frame: &[u8]) -> Result<Message, BootError> {
        let head: &[u8; HEADER] = frame
            .get(..HEADER)
            .and_then(|h| h.try_into().ok())
            .ok_or(BootError::Truncated { need: HEADER, got: frame.len() })?;
        let (kind, len) = check_header(head)?;
        let body = &frame[HEADER..];
        if body.len() < len {
            return Err(BootError::Truncated { need: HEADER + len, got: frame.len() });
        }
        if body.len() > len {
            return Err(BootError::Field("bytes after the frame"));
        }
        decode_body(kind, body)
    }

    /// Reads one frame from `r`: the header, then (only if its length is
    /// acceptable) the body. A stream that ends early is `Truncated`.
    pub fn read_from(r: &mut impl Read) -> Result<Message, BootError> {
        let mut head = [0u8; HEADER];
        read_full(r, &mut head, HEADER)?;
        let (kind, len) = check_header(&head)?;
        let mut body = [0u8; MAX_BODY];
        read_full(r, &mut body[..len], HEADER + len).map_err(|e| match e {
            BootError::Truncated { need, got } => BootError::Truncated { need, got: got + HEADER },
            e => e,
        })?;
        decode_body(kind, &body[..len])
    }

    /// Writes this message's frame to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), BootError> {
        w.write_all(&self.encode())?;
        w.flush()?;
        Ok(())
    }
}

/// Fills `buf` from `r`; `need` is the frame size reported if it ends early.
fn read_full(r: &mut impl Read, buf: &mut [u8], need: usize) -> Result<(), BootError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(BootError::Truncated { need, got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Validates a header; returns the kind and body length.
fn check_header(head: &[u8; HEADER]) -> Result<(u8, usize), BootError> {
    let magic = [head[0], head[1], head[2], head[3]];
    if magic != MAGIC {
        return Err(BootError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if version != VERSION {
        return Err(BootError::Version(version));
    }
    let (kind, reserved) = (head[6], head[7]);
    if !matches!(kind, KIND_HELLO | KIND_WELCOME | KIND_REJECT) {
        return Err(BootError::Kind(kind));
    }
    if reserved != 0 {
        return Err(BootError::Reserved(reserved));
    }
    let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if len as usize > MAX_BODY {
        return Err(BootError::TooLong(len));
    }
    Ok((kind, len as usize))
}

fn decode_body(kind: u8, body: &[u8]) -> Result<Message, BootError> {
    let want = match kind {
        KIND_HELLO => ENDPOINT + 2 + text_len(&body[ENDPOINT.min(body.len())..]),
        KIND_WELCOME => WELCOME,
        _ => 2 + text_len(body),
    };
    if body.len() != want {
        return Err(BootError::BodySize { kind, want, got: body.len() });
    }
    let mut r = Fields { bytes: body };
    Ok(match kind {
        KIND_HELLO => {
            let endpoint = Endpoint::decode(&mut r)?;
            Message::Hello(Hello { endpoint, label: r.text("client label")? })
        }
        KIND_WELCOME => {
            let endpoint = Endpoint::decode(&mut r)?;
            let (addr, rkey, size) = (r.u64(), r.u32(), r.u64());
            if size == 0 || addr.checked_add(size).is_none() {
                return Err(BootError::Field("region (empty, or past the end of the address space)"));
            }
            Message::Welcome(Welcome { endpoint, addr, rkey, size })
        }
        _ => Message::Reject(Reject { reason: r.text("reject reason")? }),
    })
}

/// The length a text field announces (its first two bytes), or 0 if the
/// body is too short to say: the size check then fails.
fn text_len(bytes: &[u8]) -> usize {
    match bytes {
        [a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
        _ => 0,
    }
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// A cursor over a body whose size was checked against its layout, so the
/// reads cannot run past its end.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl Fields<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        head.try_into().expect("split_at gave N bytes")
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn text(&mut self, what: &'static str) -> Result<String, BootError> {
        let len = self.u16() as usize;
        if len > MAX_TEXT {
            return Err(BootError::Field(what));
        }
        let (s, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        core::str::from_utf8(s).map(str::to_owned).map_err(|_| BootError::Field(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn endpoint() -> Endpoint {
        Endpoint { lid: 7, qpn: 0x12_3456, psn: 0xab_cdef, gid: [9; 16], mtu: 5, rd_atomic: 16 }
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello(Hello { endpoint: endpoint(), label: "host-a pid 42".into() }),
            Message::Hello(Hello { endpoint: Endpoint::default(), label: String::new() }),
            Message::Welcome(Welcome { endpoint: endpoint(), addr: 0x7f00_0000_0000, rkey: 0x1234, size: 1 << 30 }),
            Message::Reject(Reject { reason: "too many clients".into() }),
        ]
    }

    #[test]
    fn every_message_survives_a_roundtrip() {
        for m in samples() {
            let frame = m.encode();
            assert_eq!(Message::decode(&frame), Ok(m.clone()));
            assert_eq!(Message::read_from(&mut &frame[..]), Ok(m));
        }
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let label = "é".repeat(MAX_TEXT);
        let m = Message::Hello(Hello { endpoint: endpoint(), label });
        let Ok(Message::Hello(h)) = Message::decode(&m.encode()) else { panic!() };
        assert_eq!(h.label.len(), MAX_TEXT);
        assert!(h.label.chars().all(|c| c == 'é'));
    }

    #[test]
    fn every_truncation_is_refused() {
        for m in samples() {
            let frame = m.encode();
            for cut in 0..frame.len() {
                let e = Message::decode(&frame[..cut]).unwrap_err();
                assert!(matches!(e, BootError::Truncated { .. }), "cut at {cut}: {e:?}");
                let e = Message::read_from(&mut &frame[..cut]).unwrap_err();
                assert!(matches!(e, BootError::Truncated { .. }), "cut at {cut}: {e:?}");
            }
        }
    }

    #[test]
    fn bad_headers_are_refused_with_what_is_wrong() {
        let good = samples()[0].encode();
        let with = |at: usize, bytes: &[u8]| {
            let mut f = good.clone();
            f[at..at + bytes.len()].copy_from_slice(bytes);
            Message::decode(&f).unwrap_err()
        };
        assert_eq!(with(0, b"GET "), BootError::BadMagic(*b"GET "));
        assert_eq!(with(4, &1u16.to_le_bytes()), BootError::Version(1), "version 1 had no MTU or READ depth");
        assert_eq!(with(4, &3u16.to_le_bytes()), BootError::Version(3));
        // The limits both ends agree on must be possible values.
        assert_eq!(with(HEADER + 26, &[0]), BootError::Field("path MTU (not 1 to 5)"));
        assert_eq!(with(HEADER + 26, &[6]), BootError::Field("path MTU (not 1 to 5)"));
        assert_eq!(with(HEADER + 27, &[0]), BootError::Field("outstanding READs and atomics (zero)"));
        assert_eq!(with(4, &0u16.to_le_bytes()), BootError::Version(0));
        assert_eq!(with(6, &[9]), BootError::Kind(9));
        assert_eq!(with(7, &[1]), BootError::Reserved(1));
        assert_eq!(with(8, &u32::MAX.to_le_bytes()), BootError::TooLong(u32::MAX));
        // A length shorter than the body: read from a stream, the body is
        // too short for a hello; as a whole frame, bytes are left over.
        let mut short = good.clone();
        short[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(Message::read_from(&mut &short[..]), Err(BootError::BodySize { kind: 1, .. })));
        assert!(matches!(Message::decode(&short), Err(BootError::Field(_))));
        // A welcome's body announced as a hello's.
        let welcome = samples()[2].encode();
        let mut f = welcome.clone();
        f[6] = KIND_HELLO;
        assert!(matches!(Message::decode(&f), Err(BootError::BodySize { .. })));
        assert!(BootError::Version(1).to_string().contains("speaks 2"));
    }

    #[test]
    fn impossible_fields_are_refused() {
        let mut bad_qpn = endpoint();
        bad_qpn.qpn = 1 << 24;
        let f = Message::Hello(Hello { endpoint: bad_qpn, label: "x".into() }).encode();
        assert!(matches!(Message::decode(&f), Err(BootError::Field(_))));
        let f = Message::Welcome(Welcome { endpoint: endpoint(), addr: u64::MAX, rkey: 1, size: 2 }).encode();
        assert!(matches!(Message::decode(&f), Err(BootError::Field(_))));
        let f = Message::Welcome(Welcome { endpoint: endpoint(), addr: 0, rkey: 1, size: 0 }).encode();
        assert!(matches!(Message::decode(&f), Err(BootError::Field(_))));
        // A label that is not UTF-8.
        let mut f = Message::Hello(Hello { endpoint: endpoint(), label: "ab".into() }).encode();
        let n = f.len();
        f[n - 1] = 0xff;
        assert_eq!(Message::decode(&f), Err(BootError::Field("client label")));
        // A reject announcing a reason longer than the limit.
        let mut f = Message::Reject(Reject { reason: "r".repeat(MAX_TEXT) }).encode();
        f[HEADER..HEADER + 2].copy_from_slice(&(MAX_TEXT as u16 + 1).to_le_bytes());
        assert!(Message::decode(&f).is_err());
    }

    #[test]
    fn bytes_after_a_frame_are_refused() {
        let mut f = samples()[3].encode();
        f.push(0);
        assert!(Message::decode(&f).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Message::decode(&bytes);
            let _ = Message::read_from(&mut &bytes[..]);
        }

        #[test]
        fn a_valid_header_with_random_bodies_never_panics(
            kind in 0u8..5,
            body in proptest::collection::vec(any::<u8>(), 0..MAX_BODY + 8),
        ) {
            let mut f = Vec::new();
            f.extend_from_slice(&MAGIC);
            f.extend_from_slice(&VERSION.to_le_bytes());
            f.extend_from_slice(&[kind, 0]);
            f.extend_from_slice(&(body.len() as u32).to_le_bytes());
            f.extend_from_slice(&body);
            if let Ok(m) = Message::decode(&f) {
                // Whatever decodes re-encodes to the same frame.
                prop_assert_eq!(m.encode(), f);
            }
        }

        #[test]
        fn any_hello_roundtrips(
            lid: u16, qpn in 0u32..1 << 24, psn in 0u32..1 << 24, gid: [u8; 16], mtu in 1u8..=5, rd_atomic in 1u8..,
            label in ".{0,80}",
        ) {
            let m = Message::Hello(Hello { endpoint: Endpoint { lid, qpn, psn, gid, mtu, rd_atomic }, label });
            let frame = m.encode();
            let back = Message::decode(&frame).unwrap();
            if let (Message::Hello(a), Message::Hello(b)) = (&m, &back) {
                prop_assert_eq!(a.endpoint, b.endpoint);
                prop_assert!(a.label.starts_with(&b.label));
            } else {
                prop_assert!(false, "decoded as {:?}", back);
            }
        }
    }
}
