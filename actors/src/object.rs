//! The object collectives (`broadcast_object_list`, `all_gather_object`, `gather_object`,
//! `scatter_object_list`) for any serde type, encoded with bincode 2.
//!
//! Like torch, each is two collectives: the encoded sizes first, then the bytes (padded to
//! the largest where the collective needs equal sizes). Both take their places in the
//! group's order when the method is called. An object that fails to encode is announced
//! with a size of −1, so every rank fails with [`Error::Serialization`] and none waits for
//! the second half.

use crate::comm::{gathered, many, one, Communicator};
use crate::work::Work;
use collectix_runtime::collective::{Request, TensorSpec};
use collectix_runtime::{DType, Error, Result, Tensor};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest object accepted from a peer (bytes).
const MAX_OBJECT: usize = 1 << 30;

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(v, bincode::config::standard())
        .map_err(|e| Error::Serialization(e.to_string()))
}

fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T> {
    let cfg = bincode::config::standard().with_limit::<MAX_OBJECT>();
    bincode::serde::decode_from_slice(b, cfg)
        .map(|(v, _)| v)
        .map_err(|e| Error::Serialization(e.to_string()))
}

fn len_of(r: &Result<Vec<u8>>) -> i64 {
    r.as_ref().map_or(-1, |b| b.len() as i64)
}

/// The sizes as usizes, or the sender's encoding failure.
fn sizes(t: &Tensor) -> Result<Vec<usize>> {
    t.as_slice::<i64>()?
        .iter()
        .map(|&n| {
            usize::try_from(n)
                .map_err(|_| Error::Serialization("a rank could not encode its object".into()))
        })
        .collect()
}

fn padded(mut b: Vec<u8>, n: usize) -> Tensor {
    b.resize(n, 0);
    Tensor::from_vec(b)
}

impl Communicator {
    /// `broadcast_object_list` for one object: rank `src` passes `Some(obj)`, every rank gets
    /// a copy.
    #[track_caller]
    pub fn broadcast_object<T>(&self, obj: Option<T>, src: usize) -> Work<T>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let bytes = if self.rank() == src {
            obj.as_ref().map_or_else(
                || Err(Error::invalid("the source must pass an object")),
                encode,
            )
        } else {
            Ok(Vec::new())
        };
        let sent = len_of(&bytes).max(0) as u64;
        self.measure("broadcast_object_list", sent, || {
            self.broadcast_object_parts(bytes, src)
        })
    }

    /// [`broadcast_object`](Self::broadcast_object)'s two collectives, on `bytes` (the
    /// source's encoded object).
    #[track_caller]
    fn broadcast_object_parts<T>(&self, bytes: Result<Vec<u8>>, src: usize) -> Work<T>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let first = self.part(
            Request::Broadcast {
                tensor: Tensor::from_vec(vec![len_of(&bytes)]),
                root: src,
            },
            one,
        );
        self.member.chain(
            first,
            move |lens, me, seq| {
                let n = sizes(&lens)?[0];
                let data = if me.group_rank() == src {
                    Tensor::from_vec(bytes?)
                } else {
                    Tensor::zeros(&[n], DType::U8)?
                };
                me.issue_at(
                    seq,
                    Request::Broadcast {
                        tensor: data,
                        root: src,
                    },
                    one,
                )
            },
            |t| decode(t.as_slice::<u8>()?),
        )
    }

    /// `all_gather_object`: every rank gets every rank's object, in rank order.
    #[track_caller]
    pub fn all_gather_object<T>(&self, obj: &T) -> Work<Vec<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let bytes = encode(obj);
        let sent = len_of(&bytes).max(0) as u64;
        self.measure("all_gather_object", sent, || {
            let first = self.gather_sizes(&bytes);
            self.member.chain(
                first,
                move |lens, me, seq| {
                    let specs = sizes(&lens)?
                        .into_iter()
                        .map(|n| TensorSpec::new(&[n], DType::U8))
                        .collect();
                    me.issue_at(
                        seq,
                        Request::AllGather {
                            input: Tensor::from_vec(bytes?),
                            outputs: specs,
                        },
                        many,
                    )
                },
                |ts| ts.iter().map(|t| decode(t.as_slice::<u8>()?)).collect(),
            )
        })
    }

    /// `gather_object`: rank `dst` gets every rank's object (`Some`), the others `None`.
    #[track_caller]
    pub fn gather_object<T>(&self, obj: &T, dst: usize) -> Work<Option<Vec<T>>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let bytes = encode(obj);
        let sent = len_of(&bytes).max(0) as u64;
        self.measure("gather_object", sent, || {
            let first = self.gather_sizes(&bytes);
            self.member.chain(
                first,
                move |lens, me, seq| {
                    let lens = sizes(&lens)?;
                    let max = lens.iter().copied().max().unwrap_or(0);
                    let input = padded(bytes?, max);
                    let w = me.issue_at(seq, Request::Gather { input, root: dst }, gathered)?;
                    Ok(me.map_work(w, move |list| Ok(list.map(|l| (l, lens)))))
                },
                |got: Option<(Vec<Tensor>, Vec<usize>)>| match got {
                    None => Ok(None),
                    Some((list, lens)) => list
                        .iter()
                        .zip(lens)
                        .map(|(t, n)| decode(t.as_slice::<u8>()?.get(..n).unwrap_or(&[])))
                        .collect::<Result<Vec<T>>>()
                        .map(Some),
                },
            )
        })
    }

    /// `scatter_object_list` for one object per rank: rank `src` passes one object per rank,
    /// every rank gets its own.
    #[track_caller]
    pub fn scatter_object<T>(&self, objs: Option<Vec<T>>, src: usize) -> Work<T>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let w = self.size();
        let encoded: Result<Vec<Vec<u8>>> = if self.rank() == src {
            match objs {
                Some(v) if v.len() == w => v.iter().map(encode).collect(),
                Some(v) => Err(Error::invalid(format!(
                    "scatter list has {} objects for {w} ranks",
                    v.len()
                ))),
                None => Err(Error::invalid("the source must pass a list of objects")),
            }
        } else {
            Ok(Vec::new())
        };
        let lens: Vec<i64> = match &encoded {
            Ok(v) if self.rank() == src => v.iter().map(|b| b.len() as i64).collect(),
            Ok(_) => vec![0; w],
            Err(_) => vec![-1; w],
        };
        let sent = lens.iter().map(|&n| n.max(0) as u64).sum();
        self.measure("scatter_object_list", sent, || {
            self.scatter_object_parts(encoded, lens, src)
        })
    }

    /// [`scatter_object`](Self::scatter_object)'s two collectives, on `encoded` (the
    /// source's encoded objects) of sizes `lens` (−1 each for a failure).
    #[track_caller]
    fn scatter_object_parts<T>(
        &self,
        encoded: Result<Vec<Vec<u8>>>,
        lens: Vec<i64>,
        src: usize,
    ) -> Work<T>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let first = self.part(
            Request::Broadcast {
                tensor: Tensor::from_vec(lens),
                root: src,
            },
            one,
        );
        self.member.chain(
            first,
            move |lens, me, seq| {
                let lens = sizes(&lens)?;
                let max = lens.iter().copied().max().unwrap_or(0);
                let inputs = if me.group_rank() == src {
                    Some(encoded?.into_iter().map(|b| padded(b, max)).collect())
                } else {
                    None
                };
                let own = lens[me.group_rank()];
                let req = Request::Scatter {
                    output: TensorSpec::new(&[max], DType::U8),
                    inputs,
                    root: src,
                };
                let w = me.issue_at(seq, req, one)?;
                Ok(me.map_work(w, move |t| Ok((t, own))))
            },
            |(t, n): (Tensor, usize)| decode(t.as_slice::<u8>()?.get(..n).unwrap_or(&[])),
        )
    }

    /// All-gathers every rank's encoded size (−1 for a failure to encode).
    #[track_caller]
    fn gather_sizes(&self, bytes: &Result<Vec<u8>>) -> Work<Tensor> {
        self.part(
            Request::AllGatherIntoTensor {
                input: Tensor::from_vec(vec![len_of(bytes)]),
                output: TensorSpec::new(&[self.size()], DType::I64),
            },
            one,
        )
    }
}
