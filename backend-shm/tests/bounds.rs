//! Random requests, as garbled remote data would produce them: node ids,
//! offsets, lengths, alignments and pipelines. Each must either do exactly
//! what a byte-array model of the memory says or fail with the error the
//! model predicts, never panic or touch memory outside the request.
#![cfg(not(loom))]

use proptest::prelude::*;
use swarm_backend_shm::{ShmCluster, ShmMemory};
use swarm_core::substrate::exec::block_on;
use swarm_core::{MAX_PIPELINE, MemErrorKind, Memory, NodeId, Op, OpOutput, RemoteAddr};

const NODES: usize = 3;
const SIZE: u64 = 256;

/// What a request should do, by the model.
fn expected_error(node: u16, ops: &[ModelOp]) -> Option<MemErrorKind> {
    if usize::from(node) >= NODES {
        return Some(MemErrorKind::NoSuchNode);
    }
    if ops.is_empty() || ops.len() > MAX_PIPELINE {
        return Some(MemErrorKind::BadPipeline { len: ops.len() });
    }
    ops.iter().find_map(|op| op.error())
}

#[derive(Clone, Debug)]
enum ModelOp {
    Read { offset: u64, len: usize },
    Write { offset: u64, data: Vec<u8> },
    Cas { offset: u64, expected: u64, new: u64 },
}

impl ModelOp {
    fn error(&self) -> Option<MemErrorKind> {
        let in_bounds = |offset: u64, len: usize| u128::from(offset) + len as u128 <= u128::from(SIZE);
        match *self {
            ModelOp::Read { offset, len } => {
                (!in_bounds(offset, len)).then_some(MemErrorKind::OutOfBounds { offset, len: len as u64 })
            }
            ModelOp::Write { offset, ref data } => {
                (!in_bounds(offset, data.len())).then_some(MemErrorKind::OutOfBounds { offset, len: data.len() as u64 })
            }
            ModelOp::Cas { offset, .. } if !offset.is_multiple_of(8) => Some(MemErrorKind::Misaligned { offset }),
            ModelOp::Cas { offset, .. } => {
                (!in_bounds(offset, 8)).then_some(MemErrorKind::OutOfBounds { offset, len: 8 })
            }
        }
    }

    fn op(&self) -> Op<'_> {
        match *self {
            ModelOp::Read { offset, len } => Op::Read { offset, len },
            ModelOp::Write { offset, ref data } => Op::Write { offset, data },
            ModelOp::Cas { offset, expected, new } => Op::Cas { offset, expected, new },
        }
    }

    /// Applies a valid op to the model; returns what the backend must return.
    fn apply(&self, model: &mut [u8]) -> Expected {
        match *self {
            ModelOp::Read { offset, len } => Expected::Read(model[offset as usize..][..len].to_vec()),
            ModelOp::Write { offset, ref data } => {
                model[offset as usize..][..data.len()].copy_from_slice(data);
                Expected::Written
            }
            ModelOp::Cas { offset, expected, new } => {
                let word = &mut model[offset as usize..][..8];
                let prev = u64::from_le_bytes(word.try_into().unwrap());
                if prev == expected {
                    word.copy_from_slice(&new.to_le_bytes());
                }
                Expected::Cas(prev)
            }
        }
    }
}

#[derive(Debug, PartialEq)]
enum Expected {
    Read(Vec<u8>),
    Written,
    Cas(u64),
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..SIZE + 16,
        1 => SIZE - 16..=SIZE + 8,
        1 => any::<u64>(),
        1 => u64::MAX - 16..=u64::MAX,
    ]
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..SIZE as usize + 16, 1 => any::<usize>(), 1 => usize::MAX - 16..=usize::MAX]
}

fn model_op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        (offset(), len()).prop_map(|(offset, len)| ModelOp::Read { offset, len }),
        (offset(), proptest::collection::vec(any::<u8>(), 0..SIZE as usize + 16))
            .prop_map(|(offset, data)| ModelOp::Write { offset, data }),
        // Small expected values so that some CASes succeed on model memory.
        (offset(), 0..3u64, any::<u64>()).prop_map(|(offset, expected, new)| ModelOp::Cas { offset, expected, new }),
    ]
}

fn node() -> impl Strategy<Value = u16> {
    prop_oneof![8 => 0..NODES as u16 + 1, 1 => any::<u16>()]
}

/// Runs one request as a pipeline, or as a single operation when there is
/// exactly one op (to cover `read`/`write`/`cas` too), or in the background.
fn run(m: &ShmMemory, node: u16, ops: &[ModelOp], how: u8) -> Result<Vec<Expected>, MemErrorKind> {
    let node = NodeId(node);
    let got = match (how, ops) {
        (0, [ModelOp::Read { offset, len }]) => {
            block_on(m.read(RemoteAddr::new(node, *offset), *len)).map(|b| vec![Expected::Read(b.to_vec())])
        }
        (0, [ModelOp::Write { offset, data }]) => {
            block_on(m.write(RemoteAddr::new(node, *offset), data)).map(|()| vec![Expected::Written])
        }
        (0, [ModelOp::Cas { offset, expected, new }]) => {
            block_on(m.cas(RemoteAddr::new(node, *offset), *expected, *new)).map(|p| vec![Expected::Cas(p)])
        }
        _ => {
            let ops: Vec<Op<'_>> = ops.iter().map(ModelOp::op).collect();
            block_on(m.pipeline(node, &ops)).map(|outs| {
                outs.into_iter()
                    .map(|o| match o {
                        OpOutput::Read(b) => Expected::Read(b.to_vec()),
                        OpOutput::Written => Expected::Written,
                        OpOutput::Cas(p) => Expected::Cas(p),
                    })
                    .collect()
            })
        }
    };
    got.map_err(|e| {
        assert_eq!(e.node, node, "the error names the request's node");
        e.kind
    })
}

fn snapshot(m: &ShmMemory) -> Vec<Vec<u8>> {
    (0..NODES as u16)
        .map(|n| block_on(m.read(RemoteAddr::new(NodeId(n), 0), SIZE as usize)).unwrap().to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn requests_do_what_the_model_says_or_fail_cleanly(
        requests in proptest::collection::vec(
            (node(), proptest::collection::vec(model_op(), 0..MAX_PIPELINE + 2), 0..3u8),
            1..12,
        )
    ) {
        let cluster = ShmCluster::in_process(NODES, SIZE).unwrap();
        let m = cluster.memory();
        let mut model = vec![vec![0u8; SIZE as usize]; NODES];
        for (node, ops, how) in &requests {
            let want_err = expected_error(*node, ops);
            if *how == 2 {
                m.post_background(NodeId(*node), &ops.iter().map(ModelOp::op).collect::<Vec<_>>());
                if want_err.is_none() {
                    for op in ops {
                        op.apply(&mut model[usize::from(*node)]);
                    }
                }
            } else {
                let got = run(&m, *node, ops, *how);
                match want_err {
                    Some(kind) => prop_assert_eq!(got.unwrap_err(), kind),
                    None => {
                        let want: Vec<Expected> = ops.iter().map(|op| op.apply(&mut model[usize::from(*node)])).collect();
                        prop_assert_eq!(got.unwrap(), want);
                    }
                }
            }
            prop_assert_eq!(&snapshot(&m), &model, "memory differs from the model after {:?}", (node, ops));
        }
    }
}
