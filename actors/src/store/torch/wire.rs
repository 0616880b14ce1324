//! torch's `TCPStore` wire format (c10d, torch 2.2 and later), without IO: queries parsed
//! from the front of a buffer (a server's side), and queries and answers encoded.
//!
//! Every integer is little-endian; a key or a value is its length as a `u64`, then its
//! bytes. A query is a kind byte and its arguments; an answer has no kind (the client knows
//! what it asked). A client opens with `VALIDATE` (the magic `0x3C85F7CE`) and a `PING`
//! whose `u32` the server echoes. `SET`, `APPEND`, `MULTI_SET` and `VALIDATE` get no answer;
//! a `WAIT` is answered (`STOP_WAITING`) only once its keys are all set, or with
//! `WAIT_CANCELED` after the client's `CANCEL_WAIT`. A server that does not like a query
//! closes the connection: torch's protocol has no error answer.
//!
//! Nothing from the wire is trusted: every length is checked against the limits below
//! before anything is allocated, and a query of a kind this store does not serve is an error
//! naming it.

/// The magic of `VALIDATE`.
pub(crate) const MAGIC: u32 = 0x3C85_F7CE;

/// The first five bytes of every torch client's connection: `VALIDATE` and the magic.
pub(crate) const VALIDATE: [u8; 5] = [0x00, 0xce, 0xf7, 0x85, 0x3c];

/// The query kinds (torch's `QueryType`, 2.2 and later).
pub(crate) mod kind {
    pub(crate) const VALIDATE: u8 = 0;
    pub(crate) const SET: u8 = 1;
    pub(crate) const COMPARE_SET: u8 = 2;
    pub(crate) const GET: u8 = 3;
    pub(crate) const ADD: u8 = 4;
    pub(crate) const CHECK: u8 = 5;
    pub(crate) const WAIT: u8 = 6;
    pub(crate) const GETNUMKEYS: u8 = 7;
    pub(crate) const DELETE_KEY: u8 = 8;
    pub(crate) const APPEND: u8 = 9;
    pub(crate) const MULTI_GET: u8 = 10;
    pub(crate) const MULTI_SET: u8 = 11;
    pub(crate) const CANCEL_WAIT: u8 = 12;
    pub(crate) const PING: u8 = 13;
}

/// `CHECK`'s answers.
pub(crate) const READY: u8 = 0;
pub(crate) const NOT_READY: u8 = 1;
/// `WAIT`'s answer once every key is set, and `CANCEL_WAIT`'s.
pub(crate) const STOP_WAITING: u8 = 0;
pub(crate) const WAIT_CANCELED: u8 = 1;

/// The longest key (torch's libuv server's limit too).
pub(crate) const MAX_KEY: usize = 8 << 10;
/// The longest value.
pub(crate) const MAX_VALUE: usize = super::super::proto::MAX_FRAME;
/// The most keys in one query.
pub(crate) const MAX_KEYS: usize = 128 << 10;
/// The most bytes one query may take, all its keys and values together (so a `COMPARE_SET`
/// or a `MULTI_SET` carries one value's worth in all): a server holding more of a query that
/// is not whole yet drops the client.
pub(crate) const MAX_QUERY: usize = MAX_VALUE + 2 * MAX_KEY + 64;

/// One query, as a server reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Query {
    Validate(u32),
    Ping(u32),
    Set {
        key: String,
        value: Vec<u8>,
    },
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: String,
    },
    Add {
        key: String,
        delta: i64,
    },
    Check {
        keys: Vec<String>,
    },
    Wait {
        keys: Vec<String>,
    },
    NumKeys,
    Delete {
        key: String,
    },
    Append {
        key: String,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<String>,
    },
    MultiSet {
        pairs: Vec<(String, Vec<u8>)>,
    },
    CancelWait,
}

impl Query {
    /// Whether it changes the table (its effect is seen before any answer leaves).
    pub(crate) fn changes(&self) -> bool {
        matches!(
            self,
            Query::Set { .. }
                | Query::CompareSet { .. }
                | Query::Add { .. }
                | Query::Delete { .. }
                | Query::Append { .. }
                | Query::MultiSet { .. }
        )
    }
}

/// Why a parse stopped: the buffer holds only part of the query, or it is not the protocol.
enum Stop {
    More,
    Bad(String),
}

/// A parse's reading position in a buffer. A parse that does not `keep` only finds where
/// the query ends: it checks every length and copies nothing.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
    keep: bool,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.at.checked_add(n).ok_or(Stop::More)?;
        let s = self.buf.get(self.at..end).ok_or(Stop::More)?;
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        self.array().map(i64::from_le_bytes)
    }

    /// A length, checked against `max` before anything is taken.
    fn len(&mut self, max: usize, what: &str) -> Result<usize, Stop> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(Stop::Bad(format!("{what} of {n} bytes; at most {max}"))),
        }
    }

    fn bytes(&mut self) -> Result<Vec<u8>, Stop> {
        let n = self.len(MAX_VALUE, "a value")?;
        let b = self.take(n)?;
        Ok(if self.keep { b.to_vec() } else { Vec::new() })
    }

    fn key(&mut self) -> Result<String, Stop> {
        let n = self.len(MAX_KEY, "a key")?;
        let b = self.take(n)?;
        if !self.keep {
            return Ok(String::new());
        }
        String::from_utf8(b.to_vec()).map_err(|_| Stop::Bad("a key that is not UTF-8".into()))
    }

    /// Room for `n` items of at least `least` bytes each: no more than the bytes there can
    /// hold (none when not keeping).
    fn room<T>(&self, n: usize, least: usize) -> Vec<T> {
        let fits = self.buf.len().saturating_sub(self.at) / least;
        Vec::with_capacity(if self.keep { n.min(fits) } else { 0 })
    }

    fn keys(&mut self) -> Result<Vec<String>, Stop> {
        let n = self.len(MAX_KEYS, "a list of keys")?;
        let mut keys = self.room(n, 8);
        for _ in 0..n {
            let k = self.key()?;
            if self.keep {
                keys.push(k);
            }
        }
        Ok(keys)
    }
}

/// Parses the query at the front of `buf`: `Ok(None)` while it is not whole, else the query
/// and the bytes it took; `Err` naming what is wrong with it (the server then closes the
/// connection, as torch's does).
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Query, usize)>, String> {
    // First where it ends, copying nothing (a server parses again after every read of a
    // query that is not whole yet); then, once, the query.
    let mut c = Cursor {
        buf,
        at: 0,
        keep: false,
    };
    let whole = query(&mut c).map(|_| {
        c = Cursor {
            buf,
            at: 0,
            keep: true,
        };
        query(&mut c)
    });
    match whole.and_then(|q| q) {
        Ok(q) => Ok(Some((q, c.at))),
        Err(Stop::More) if buf.len() > MAX_QUERY => {
            Err(format!("a query of more than {MAX_QUERY} bytes"))
        }
        Err(Stop::More) => Ok(None),
        Err(Stop::Bad(why)) => Err(why),
    }
}

fn query(c: &mut Cursor<'_>) -> Result<Query, Stop> {
    let k = c.array::<1>()?[0];
    Ok(match k {
        kind::VALIDATE => Query::Validate(c.u32()?),
        kind::PING => Query::Ping(c.u32()?),
        kind::SET => Query::Set {
            key: c.key()?,
            value: c.bytes()?,
        },
        kind::COMPARE_SET => Query::CompareSet {
            key: c.key()?,
            expected: c.bytes()?,
            desired: c.bytes()?,
        },
        kind::GET => Query::Get { key: c.key()? },
        kind::ADD => Query::Add {
            key: c.key()?,
            delta: c.i64()?,
        },
        kind::CHECK => Query::Check { keys: c.keys()? },
        kind::WAIT => Query::Wait { keys: c.keys()? },
        kind::GETNUMKEYS => Query::NumKeys,
        kind::DELETE_KEY => Query::Delete { key: c.key()? },
        kind::APPEND => Query::Append {
            key: c.key()?,
            value: c.bytes()?,
        },
        kind::MULTI_GET => Query::MultiGet { keys: c.keys()? },
        kind::MULTI_SET => {
            let n = c.len(MAX_KEYS, "a list of keys")?;
            let mut pairs = c.room(n, 16);
            for _ in 0..n {
                let pair = (c.key()?, c.bytes()?);
                if c.keep {
                    pairs.push(pair);
                }
            }
            Query::MultiSet { pairs }
        }
        kind::CANCEL_WAIT => Query::CancelWait,
        other => {
            return Err(Stop::Bad(format!(
                "a query of kind {other}, which this store does not serve \
                 (the queues, list_keys and barrier of newer torch versions are not served)"
            )))
        }
    })
}

/// Bytes to send: a query (its kind first) or an answer.
#[derive(Default)]
pub(crate) struct Out(pub(crate) Vec<u8>);

impl Out {
    /// A query of `kind`.
    pub(crate) fn query(kind: u8) -> Out {
        Out(vec![kind])
    }

    pub(crate) fn u8(mut self, v: u8) -> Out {
        self.0.push(v);
        self
    }

    pub(crate) fn u32(mut self, v: u32) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn i64(mut self, v: i64) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A key or a value: its length, then its bytes.
    pub(crate) fn bytes(mut self, b: &[u8]) -> Out {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }

    /// A list of keys: how many, then each.
    pub(crate) fn keys<'k>(mut self, keys: impl ExactSizeIterator<Item = &'k str>) -> Out {
        self.0.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            self = self.bytes(k.as_bytes());
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a torch 2.15 client sent, captured on the wire.
    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|e| panic!("{b}: {e}")))
            .collect()
    }

    #[test]
    fn queries_a_torch_client_sent_parse_as_what_it_asked() {
        let cases = [
            ("00 ce f7 85 3c", Query::Validate(MAGIC)),
            ("0d fb 13 00 00", Query::Ping(0x13fb)),
            (
                "01 02 00 00 00 00 00 00 00 2f 6b 01 00 00 00 00 00 00 00 76",
                Query::Set {
                    key: "/k".into(),
                    value: b"v".to_vec(),
                },
            ),
            (
                "06 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b",
                Query::Wait {
                    keys: vec!["/k".into()],
                },
            ),
            (
                "04 05 00 00 00 00 00 00 00 69 6e 69 74 2f 01 00 00 00 00 00 00 00",
                Query::Add {
                    key: "init/".into(),
                    delta: 1,
                },
            ),
            ("0c", Query::CancelWait),
            ("07", Query::NumKeys),
        ];
        for (bytes, want) in cases {
            let b = hex(bytes);
            assert_eq!(parse(&b), Ok(Some((want, b.len()))), "{bytes}");
            // Every proper prefix is "not whole yet".
            for cut in 0..b.len() {
                assert_eq!(parse(&b[..cut]), Ok(None), "{bytes} cut at {cut}");
            }
        }
    }

    #[test]
    fn what_the_client_encodes_parses_back() {
        let q = Out::query(kind::COMPARE_SET)
            .bytes(b"/k")
            .bytes(b"")
            .bytes(b"new");
        let mut b = q.0;
        let more = Out::query(kind::MULTI_GET).keys(["/a", "/b"].into_iter()).0;
        b.extend_from_slice(&more);
        let Ok(Some((first, used))) = parse(&b) else {
            panic!("{:?}", parse(&b))
        };
        assert_eq!(
            first,
            Query::CompareSet {
                key: "/k".into(),
                expected: Vec::new(),
                desired: b"new".to_vec()
            }
        );
        assert_eq!(
            parse(&b[used..]),
            Ok(Some((
                Query::MultiGet {
                    keys: vec!["/a".into(), "/b".into()]
                },
                more.len()
            )))
        );
    }

    #[test]
    fn lengths_past_the_limits_and_unknown_kinds_are_refused_before_allocating() {
        let huge = Out::query(kind::SET).i64(1 << 40).0;
        assert!(matches!(parse(&huge), Err(w) if w.contains("a key of 1099511627776")));
        let many = Out::query(kind::WAIT).i64(i64::MAX).0;
        assert!(matches!(parse(&many), Err(w) if w.contains("a list of keys")));
        assert!(matches!(parse(&[0x12, 0, 0]), Err(w) if w.contains("kind 18")));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n"), Err(w) if w.contains("kind 71")));
        let not_utf8 = Out::query(kind::GET).bytes(&[0xff, 0xfe]).0;
        assert!(matches!(parse(&not_utf8), Err(w) if w.contains("UTF-8")));
    }
}
