//! Tests of the checker: hand-made histories, the models, and properties
//! over histories made by executing operations at known linearization points.

use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;

use KvOp::{Delete, Get, Insert, Update};
use RegisterOp::{Read, Write};
use RegisterRet::{Ack, Value};

type RegOp = Operation<RegisterOp, RegisterRet>;
type KvOperation = Operation<KvOp, KvRet>;

fn w(client: u32, call: u64, ret: u64, v: u64) -> RegOp {
    Operation::completed(client, call, ret, Write(v), Ack)
}

fn r(client: u32, call: u64, ret: u64, v: u64) -> RegOp {
    Operation::completed(client, call, ret, Read, Value(v))
}

fn kv(client: u32, call: u64, ret: u64, op: KvOp, out: KvRet) -> KvOperation {
    Operation::completed(client, call, ret, op, out)
}

fn reg_ok(h: &[RegOp]) -> bool {
    let res = check(&Register::default(), h);
    assert!(!res.is_unknown(), "{res}");
    res.is_linearizable()
}

fn kv_ok(model: Kv, h: &[KvOperation]) -> bool {
    let res = check(&model, h);
    assert!(!res.is_unknown(), "{res}");
    res.is_linearizable()
}

// ---- Registers: rejected ----

#[test]
fn stale_read_after_completed_write_is_rejected() {
    assert!(!reg_ok(&[w(0, 0, 1, 1), r(1, 2, 3, 0)]));
    // Also when a later write overwrote it: 2 was written after 1 completed.
    assert!(!reg_ok(&[w(0, 0, 1, 1), w(0, 2, 3, 2), r(1, 4, 5, 1)]));
}

#[test]
fn reads_seeing_concurrent_writes_in_opposite_orders_are_rejected() {
    let h = [w(0, 0, 100, 1), w(1, 0, 100, 2), r(2, 1, 2, 1), r(2, 3, 4, 2), r(3, 1, 2, 2), r(3, 3, 4, 1)];
    assert!(!reg_ok(&h));
    // Each reader alone is fine.
    assert!(reg_ok(&h[..4]));
    assert!(reg_ok(&[h[0].clone(), h[1].clone(), h[4].clone(), h[5].clone()]));
}

#[test]
fn read_of_a_value_never_written_is_rejected() {
    assert!(!reg_ok(&[r(0, 0, 1, 7)]));
    assert!(!reg_ok(&[w(0, 0, 10, 1), r(1, 2, 3, 7)]));
    // Even a pending write of another value does not explain it.
    assert!(!reg_ok(&[Operation::pending(0, 0, Write(8)), r(1, 2, 3, 7)]));
}

#[test]
fn read_back_in_time_is_rejected() {
    // A read saw the new value, a later read the old one.
    assert!(!reg_ok(&[w(0, 0, 10, 1), r(1, 1, 2, 1), r(2, 3, 4, 0)]));
}

// ---- Registers: accepted ----

#[test]
fn concurrent_writes_linearize_in_either_order() {
    let writes = [w(0, 0, 10, 1), w(1, 1, 9, 2)];
    for seen in [1, 2] {
        let mut h = writes.to_vec();
        h.push(r(2, 11, 12, seen));
        assert!(reg_ok(&h), "read of {seen}");
    }
    // A read overlapping both may see either, or the initial value.
    for seen in [0, 1, 2] {
        let mut h = writes.to_vec();
        h.push(r(2, 5, 6, seen));
        assert!(reg_ok(&h), "read of {seen}");
    }
}

#[test]
fn pending_operations_may_or_may_not_take_effect() {
    let pw = Operation::pending(0, 0, Write(5));
    // It took effect.
    assert!(reg_ok(&[pw.clone(), r(1, 3, 4, 5)]));
    // It did not (yet, or ever).
    assert!(reg_ok(&[pw.clone(), r(1, 3, 4, 0)]));
    // It took effect late.
    assert!(reg_ok(&[pw.clone(), r(1, 1, 2, 0), r(1, 3, 4, 5)]));
    // But once seen, its effect stays.
    assert!(!reg_ok(&[pw.clone(), r(1, 1, 2, 5), r(1, 3, 4, 0)]));
    // It cannot take effect before its invocation.
    assert!(!reg_ok(&[r(1, 1, 2, 5), Operation::pending(0, 3, Write(5))]));
    // Pending reads are ignored whatever they are.
    assert!(reg_ok(&[pw, Operation::pending(2, 0, Read), w(1, 1, 2, 3), r(1, 3, 4, 3)]));
}

#[test]
fn touching_intervals_count_as_concurrent() {
    // The write returned at 5 and the read was invoked at 5: with closed
    // intervals the read may come first.
    assert!(reg_ok(&[w(0, 0, 5, 1), r(1, 5, 6, 0)]));
    assert!(!reg_ok(&[w(0, 0, 5, 1), r(1, 6, 7, 0)]));
}

#[test]
fn register_initial_value_is_configurable() {
    assert!(check(&Register::new(9), &[r(0, 0, 1, 9)]).is_linearizable());
    assert!(check(&Register::new(9), &[r(0, 0, 1, 0)]).is_violation());
}

#[test]
fn empty_and_all_pending_histories_are_linearizable() {
    assert!(reg_ok(&[]));
    assert!(reg_ok(&[Operation::pending(0, 0, Write(1)), Operation::pending(1, 0, Read)]));
}

#[test]
fn history_recorder_records_pending_and_completed_operations() {
    let mut h = History::new();
    let a = h.invoke(0, 1, Write(7));
    let b = h.invoke(1, 2, Read);
    let _c = h.invoke(2, 3, Write(9));
    h.respond(b, 4, Value(7));
    h.respond(a, 5, Ack);
    assert_eq!(h.len(), 3);
    assert!(h.operations()[2].is_pending());
    assert!(check(&Register::default(), h.operations()).is_linearizable());
}

#[test]
#[should_panic(expected = "before its invocation")]
fn a_response_before_the_invocation_panics() {
    let _ = check(&Register::default(), &[w(0, 5, 4, 1)]);
}

#[test]
fn budget_exhaustion_answers_unknown() {
    // Readers seeing two concurrent writes in opposite orders: each read
    // alone is fine, so only a search finds the violation.
    let h = [w(0, 0, 100, 1), w(1, 0, 100, 2), r(2, 1, 2, 1), r(2, 3, 4, 2), r(3, 1, 2, 2), r(3, 3, 4, 1)];
    let res = Checker::new().max_steps(2).check(&Register::default(), &h);
    assert!(res.is_unknown(), "{res}");
    assert!(res.to_string().contains("ran out of its budget"), "{res}");
    // With enough budget the answer is definite.
    assert!(Checker::new().max_steps(1_000).check(&Register::default(), &h).is_violation());
}

#[test]
fn violation_explains_where_the_search_failed() {
    let h = [w(0, 0, 1, 1), w(0, 2, 3, 2), r(1, 2, 3, 1), r(1, 4, 5, 1)];
    let res = check(&Register::default(), &h);
    let v = res.violation().expect("not linearizable");
    assert_eq!(v.stuck, 3);
    assert_eq!(v.state, 2);
    assert_eq!(v.prefix, vec![0, 2, 1]);
    let text = res.to_string();
    assert!(text.contains("NOT linearizable"), "{text}");
    assert!(text.contains("#3 client 1 [4, 5] Read -> Value(1)"), "{text}");
    assert!(text.contains("stuck; the model answers Value(2)"), "{text}");
}

#[test]
fn windows_refute_a_stale_read_locally() {
    let h = [w(0, 0, 1, 1), w(0, 2, 3, 2), r(1, 4, 5, 1)];
    assert_eq!(key::refute_by_windows(&Register::default(), &h), Some((2, 2)));
    // The same from the initial state.
    assert!(!reg_ok(&h));
}

#[test]
fn a_violation_found_in_a_window_says_so() {
    // Sixteen clients writing and reading concurrently, then one read of a
    // value nobody wrote: too hard for the first search, found by a window.
    let mut h = big_register_history(7, 16, 300, true);
    let i = h.iter().rposition(|op| op.input == Read && !op.is_pending()).unwrap();
    h[i].response.as_mut().unwrap().output = Value(1_000_000);
    let res = check(&Register::default(), &h);
    let v = res.violation().expect("not linearizable");
    assert_eq!(v.stuck, i);
    if v.from.is_some() {
        assert!(res.to_string().contains("fit no starting state"), "{res}");
    }
}

// ---- Key-value store ----

#[test]
fn kv_model_semantics() {
    let m = Kv::default();
    let run = |ops: &[KvOp]| {
        let mut s = m.init();
        let mut outs = Vec::new();
        for op in ops {
            let (next, out) = m.step(&s, op);
            s = next;
            outs.push(out);
        }
        outs
    };
    use KvRet::{Deleted, Found, NotFound, Ok};
    assert_eq!(run(&[Get(1), Update(1, 5), Delete(1)]), [NotFound, NotFound, NotFound]);
    assert_eq!(run(&[Insert(1, 5), Get(1), Insert(1, 6), Get(1)]), [Ok, Found(5), Ok, Found(6)]);
    assert_eq!(run(&[Insert(1, 5), Update(1, 7), Get(1)]), [Ok, Ok, Found(7)]);
    assert_eq!(
        run(&[Insert(1, 5), Delete(1), Get(1), Update(1, 2), Delete(1), Get(1), Insert(1, 3), Get(1)]),
        [Ok, Ok, Deleted, NotFound, NotFound, Deleted, Ok, Found(3)]
    );
    let plain = Kv::new(false);
    let (s, _) = plain.step(&KeyState::Present(5), &Delete(1));
    assert_eq!(plain.step(&s, &Get(1)).1, NotFound);
}

#[test]
fn kv_get_of_old_value_after_completed_update_is_rejected() {
    let h = [
        kv(0, 0, 1, Insert(1, 10), KvRet::Ok),
        kv(0, 2, 3, Update(1, 20), KvRet::Ok),
        kv(1, 4, 5, Get(1), KvRet::Found(10)),
    ];
    assert!(!kv_ok(Kv::default(), &h));
    let mut fine = h.clone();
    fine[2].response.as_mut().unwrap().output = KvRet::Found(20);
    assert!(kv_ok(Kv::default(), &fine));
}

#[test]
fn kv_not_found_after_completed_insert_is_rejected() {
    let h = [kv(0, 0, 1, Insert(1, 10), KvRet::Ok), kv(1, 2, 3, Get(1), KvRet::NotFound)];
    assert!(!kv_ok(Kv::default(), &h));
    // Concurrent with the insert, it may miss it.
    let h = [kv(0, 0, 3, Insert(1, 10), KvRet::Ok), kv(1, 2, 3, Get(1), KvRet::NotFound)];
    assert!(kv_ok(Kv::default(), &h));
}

#[test]
fn kv_value_of_a_key_deleted_before_is_rejected() {
    let h = [
        kv(0, 0, 1, Insert(1, 10), KvRet::Ok),
        kv(0, 2, 3, Delete(1), KvRet::Ok),
        kv(1, 4, 5, Get(1), KvRet::Found(10)),
    ];
    assert!(!kv_ok(Kv::default(), &h));
    assert!(!kv_ok(Kv::new(false), &h));
}

#[test]
fn kv_deleted_and_not_found_are_told_apart_with_tombstones() {
    let base = [kv(0, 0, 1, Insert(1, 10), KvRet::Ok), kv(0, 2, 3, Delete(1), KvRet::Ok)];
    let with = |out| {
        let mut h = base.to_vec();
        h.push(kv(1, 4, 5, Get(1), out));
        h
    };
    assert!(kv_ok(Kv::default(), &with(KvRet::Deleted)));
    assert!(!kv_ok(Kv::default(), &with(KvRet::NotFound)));
    assert!(kv_ok(Kv::new(false), &with(KvRet::NotFound)));
    assert!(!kv_ok(Kv::new(false), &with(KvRet::Deleted)));
    // A key never inserted is not "deleted".
    assert!(!kv_ok(Kv::default(), &[kv(0, 0, 1, Get(2), KvRet::Deleted)]));
}

#[test]
fn kv_update_and_delete_of_missing_keys_answer_not_found() {
    let h = [
        kv(0, 0, 1, Update(1, 5), KvRet::NotFound),
        kv(0, 2, 3, Delete(1), KvRet::NotFound),
        kv(0, 4, 5, Get(1), KvRet::NotFound),
    ];
    assert!(kv_ok(Kv::default(), &h));
    // An update that claims success on a missing key is wrong.
    assert!(!kv_ok(Kv::default(), &[kv(0, 0, 1, Update(1, 5), KvRet::Ok)]));
    // A concurrent insert can make it right.
    let h = [
        kv(1, 0, 2, Insert(1, 4), KvRet::Ok),
        kv(0, 1, 3, Update(1, 5), KvRet::Ok),
        kv(0, 4, 5, Get(1), KvRet::Found(5)),
    ];
    assert!(kv_ok(Kv::default(), &h));
}

#[test]
fn kv_keys_are_checked_independently_and_the_violation_names_the_key() {
    let mut h = Vec::new();
    for k in 0..5u64 {
        h.push(kv(k as u32, 10 * k, 10 * k + 1, Insert(k, k + 100), KvRet::Ok));
        h.push(kv(9, 10 * k + 2, 10 * k + 3, Get(k), KvRet::Found(k + 100)));
    }
    assert!(kv_ok(Kv::default(), &h));
    // Key 3's get misses the insert that completed before it.
    h[7].response.as_mut().unwrap().output = KvRet::NotFound;
    let res = check(&Kv::default(), &h);
    let v = res.violation().expect("not linearizable");
    assert_eq!(v.key, 3);
    assert_eq!(v.stuck, 7);
    assert!(v.window.iter().all(|w| w.op.input.key() == 3), "{v}");
    assert!(res.to_string().contains("key 3 is not linearizable"), "{res}");
}

#[test]
fn kv_pending_operations_may_or_may_not_take_effect() {
    let pd = Operation::pending(0, 2, Delete(1));
    let ins = kv(0, 0, 1, Insert(1, 10), KvRet::Ok);
    assert!(kv_ok(Kv::default(), &[ins.clone(), pd.clone(), kv(1, 3, 4, Get(1), KvRet::Deleted)]));
    assert!(kv_ok(Kv::default(), &[ins.clone(), pd.clone(), kv(1, 3, 4, Get(1), KvRet::Found(10))]));
    assert!(!kv_ok(Kv::default(), &[ins, pd, kv(1, 3, 4, Get(1), KvRet::NotFound)]));
}

// ---- Histories made by executing operations at known points ----

/// One operation a generated client issues: (is a write, value, gap before
/// its invocation, time from invocation to its linearization point, time
/// from that point to its response).
type Spec = (bool, u64, u64, u64, u64);

/// What a generated client does: its operations, and whether its last one
/// is pending (the client crashed) and if so whether it took effect.
type ClientSpec = (Vec<Spec>, bool, bool);

/// A register history made by really executing the clients' operations,
/// each at a point inside its interval, on a sequential register. Values are
/// small so that many writes write the same value.
fn execute_register(clients: &[ClientSpec]) -> Vec<RegOp> {
    // (operation, its linearization point if it took effect)
    let mut ops: Vec<(RegOp, Option<u64>)> = Vec::new();
    for (c, (specs, crashed, took_effect)) in clients.iter().enumerate() {
        let mut t = 0;
        for (i, &(is_write, value, gap, to_lp, to_ret)) in specs.iter().enumerate() {
            let call = t + gap;
            let lp = call + to_lp;
            t = lp + to_ret;
            let input = if is_write { Write(value) } else { Read };
            let last = i + 1 == specs.len();
            if last && *crashed {
                ops.push((Operation::pending(c as u32, call, input), took_effect.then_some(lp)));
            } else {
                ops.push((Operation::completed(c as u32, call, t, input, Ack), Some(lp)));
            }
        }
    }
    let mut order: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].1.is_some()).collect();
    order.sort_by_key(|&i| (ops[i].1, i));
    let mut value = 0;
    for i in order {
        let op = &mut ops[i].0;
        match op.input {
            Write(v) => value = v,
            Read => {
                if let Some(resp) = &mut op.response {
                    resp.output = Value(value);
                }
            }
        }
    }
    ops.into_iter().map(|(op, _)| op).collect()
}

fn client_specs(max_clients: usize, max_ops: usize) -> impl Strategy<Value = Vec<ClientSpec>> {
    let spec = (any::<bool>(), 0..4u64, 0..3u64, 0..4u64, 0..4u64);
    prop::collection::vec((prop::collection::vec(spec, 0..max_ops), any::<bool>(), any::<bool>()), 1..=max_clients)
}

proptest! {
    #[test]
    fn executed_register_histories_are_linearizable(clients in client_specs(6, 12)) {
        let h = execute_register(&clients);
        let res = check(&Register::default(), &h);
        prop_assert!(res.is_linearizable(), "{}", res);
    }

    #[test]
    fn a_read_of_a_value_never_written_is_always_caught(
        clients in client_specs(6, 12),
        which in any::<prop::sample::Index>(),
    ) {
        let mut h = execute_register(&clients);
        let reads: Vec<usize> =
            (0..h.len()).filter(|&i| h[i].input == Read && !h[i].is_pending()).collect();
        prop_assume!(!reads.is_empty());
        let i = reads[which.index(reads.len())];
        h[i].response.as_mut().unwrap().output = Value(1_000);
        let res = check(&Register::default(), &h);
        prop_assert!(res.is_violation(), "{}", res);
        let v = res.violation().unwrap();
        prop_assert!(!v.prefix.contains(&i));
        prop_assert!(v.window.iter().any(|w| w.index == v.stuck));
    }

    #[test]
    fn windows_never_refute_executed_register_histories(clients in client_specs(8, 16)) {
        let h = execute_register(&clients);
        prop_assert_eq!(key::refute_by_windows(&Register::default(), &h), None);
    }

    #[test]
    fn windows_refute_a_read_of_a_value_never_written(
        clients in client_specs(6, 12),
        which in any::<prop::sample::Index>(),
    ) {
        let mut h = execute_register(&clients);
        let reads: Vec<usize> =
            (0..h.len()).filter(|&i| h[i].input == Read && !h[i].is_pending()).collect();
        prop_assume!(!reads.is_empty());
        let i = reads[which.index(reads.len())];
        h[i].response.as_mut().unwrap().output = Value(1_000);
        prop_assert_eq!(key::refute_by_windows(&Register::default(), &h).map(|(stuck, _)| stuck), Some(i));
    }

    #[test]
    fn windows_never_refute_executed_kv_histories(
        clients in prop::collection::vec(
            (prop::collection::vec((0..4u8, 0..2u64, 0..4u64, 0..3u64, 0..4u64, 0..4u64), 0..16), any::<bool>(), any::<bool>()),
            1..=8,
        ),
        tombstones in any::<bool>(),
    ) {
        let h = execute_kv(&clients, tombstones);
        for k in 0..2 {
            let sub: Vec<KvOperation> = h.iter().filter(|op| op.input.key() == k).cloned().collect();
            prop_assert_eq!(key::refute_by_windows(&Kv::new(tombstones), &sub), None);
        }
    }

    #[test]
    fn executed_kv_histories_are_linearizable(
        clients in prop::collection::vec(
            (prop::collection::vec((0..4u8, 0..3u64, 0..4u64, 0..3u64, 0..4u64, 0..4u64), 0..12), any::<bool>(), any::<bool>()),
            1..=6,
        ),
        tombstones in any::<bool>(),
    ) {
        let h = execute_kv(&clients, tombstones);
        let res = check(&Kv::new(tombstones), &h);
        prop_assert!(res.is_linearizable(), "{}", res);
    }
}

/// What a generated key-value client does: its operations (kind, key,
/// value, gap, to the point, to the response), and whether its last one is
/// pending and if so whether it took effect.
type KvClientSpec = (Vec<(u8, u64, u64, u64, u64, u64)>, bool, bool);

/// A key-value history made by executing the clients' operations (kind,
/// key, value, gap, to the point, to the response) at points inside their
/// intervals on a map; the answers follow [`Kv`]'s table independently of
/// its code.
fn execute_kv(clients: &[KvClientSpec], tombstones: bool) -> Vec<KvOperation> {
    use alloc::collections::BTreeMap;
    let mut ops: Vec<(KvOperation, Option<u64>)> = Vec::new();
    for (c, (specs, crashed, took_effect)) in clients.iter().enumerate() {
        let mut t = 0;
        for (i, &(kind, key, value, gap, to_lp, to_ret)) in specs.iter().enumerate() {
            let call = t + gap;
            let lp = call + to_lp;
            t = lp + to_ret;
            let input = match kind {
                0 => Insert(key, value),
                1 => Update(key, value),
                2 => Get(key),
                _ => Delete(key),
            };
            if i + 1 == specs.len() && *crashed {
                ops.push((Operation::pending(c as u32, call, input), took_effect.then_some(lp)));
            } else {
                ops.push((Operation::completed(c as u32, call, t, input, KvRet::Ok), Some(lp)));
            }
        }
    }
    let mut order: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].1.is_some()).collect();
    order.sort_by_key(|&i| (ops[i].1, i));
    // key -> Some(value) if present, None if deleted (absent keys are missing).
    let mut map: BTreeMap<u64, Option<u64>> = BTreeMap::new();
    for i in order {
        let op = &mut ops[i].0;
        let out = match op.input {
            Insert(k, v) => {
                map.insert(k, Some(v));
                KvRet::Ok
            }
            Update(k, v) => match map.get_mut(&k) {
                Some(Some(old)) => {
                    *old = v;
                    KvRet::Ok
                }
                _ => KvRet::NotFound,
            },
            Get(k) => match map.get(&k) {
                Some(Some(v)) => KvRet::Found(*v),
                Some(None) if tombstones => KvRet::Deleted,
                _ => KvRet::NotFound,
            },
            Delete(k) => match map.get(&k) {
                Some(Some(_)) => {
                    map.insert(k, None);
                    KvRet::Ok
                }
                _ => KvRet::NotFound,
            },
        };
        if let Some(resp) = &mut op.response {
            resp.output = out;
        }
    }
    ops.into_iter().map(|(op, _)| op).collect()
}

// ---- Against brute force ----

/// Whether some order of a subset of `h` containing every completed
/// operation respects real time and gives every completed operation its
/// answer: tries every permutation (for tiny histories only).
fn brute_force<M: Model>(model: &M, h: &[Operation<M::Input, M::Output>]) -> bool {
    fn extend<M: Model>(
        model: &M,
        h: &[Operation<M::Input, M::Output>],
        used: &mut Vec<bool>,
        state: &M::State,
    ) -> bool {
        let ret = |op: &Operation<M::Input, M::Output>| op.response.as_ref().map_or(u64::MAX, |r| r.at);
        if (0..h.len()).all(|i| used[i] || h[i].is_pending()) {
            return true;
        }
        for i in 0..h.len() {
            // Next only if no unused completed... no unused operation that
            // returned before this one was invoked may still come later.
            if used[i] || (0..h.len()).any(|j| !used[j] && j != i && ret(&h[j]) < h[i].call) {
                continue;
            }
            let (next, out) = model.step(state, &h[i].input);
            if h[i].response.as_ref().is_some_and(|r| r.output != out) {
                continue;
            }
            used[i] = true;
            if extend(model, h, used, &next) {
                return true;
            }
            used[i] = false;
        }
        false
    }
    // Pending operations may be left out: try every subset of them.
    let pending: Vec<usize> = (0..h.len()).filter(|&i| h[i].is_pending()).collect();
    (0..1u32 << pending.len()).any(|mask| {
        let mut used = vec![false; h.len()];
        for (b, &i) in pending.iter().enumerate() {
            used[i] = mask & (1 << b) != 0;
        }
        extend(model, h, &mut used, &model.init())
    })
}

/// A tiny register history with arbitrary (often wrong) answers.
fn arbitrary_register_history() -> impl Strategy<Value = Vec<RegOp>> {
    let op = (0..3u32, 0..8u64, 0..5u64, any::<bool>(), 0..3u64, prop::option::weighted(0.85, Just(())));
    prop::collection::vec(op, 0..7).prop_map(|ops| {
        ops.into_iter()
            .map(|(client, call, len, is_write, v, done)| {
                let input = if is_write { Write(v) } else { Read };
                match done {
                    Some(()) => {
                        Operation::completed(client, call, call + len, input, if is_write { Ack } else { Value(v) })
                    }
                    None => Operation::pending(client, call, input),
                }
            })
            .collect()
    })
}

/// A tiny key-value history on two keys with arbitrary answers.
fn arbitrary_kv_history() -> impl Strategy<Value = Vec<KvOperation>> {
    let out =
        prop_oneof![Just(KvRet::Ok), (0..2u64).prop_map(KvRet::Found), Just(KvRet::NotFound), Just(KvRet::Deleted)];
    let op = (0..8u64, 0..5u64, 0..4u8, 0..2u64, 0..2u64, out, prop::option::weighted(0.85, Just(())));
    prop::collection::vec(op, 0..7).prop_map(|ops| {
        ops.into_iter()
            .enumerate()
            .map(|(i, (call, len, kind, key, v, out, done))| {
                let input = match kind {
                    0 => Insert(key, v),
                    1 => Update(key, v),
                    2 => Get(key),
                    _ => Delete(key),
                };
                match done {
                    Some(()) => Operation::completed(i as u32, call, call + len, input, out),
                    None => Operation::pending(i as u32, call, input),
                }
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn register_verdicts_match_brute_force(h in arbitrary_register_history()) {
        let expected = brute_force(&Register::default(), &h);
        let res = check(&Register::default(), &h);
        prop_assert_eq!(res.is_linearizable(), expected, "{}", res);
        prop_assert!(!res.is_unknown());
        if expected {
            prop_assert_eq!(key::refute_by_windows(&Register::default(), &h), None);
        }
    }

    #[test]
    fn kv_verdicts_match_brute_force(h in arbitrary_kv_history(), tombstones in any::<bool>()) {
        // The model's state is one key's: brute force goes key by key.
        let model = Kv::new(tombstones);
        let mut expected = true;
        for k in 0..2 {
            let sub: Vec<KvOperation> = h.iter().filter(|op| op.input.key() == k).cloned().collect();
            if brute_force(&model, &sub) {
                prop_assert_eq!(key::refute_by_windows(&model, &sub), None);
            } else {
                expected = false;
            }
        }
        let res = check(&model, &h);
        prop_assert_eq!(res.is_linearizable(), expected, "{}", res);
    }
}

// ---- Size: the histories the simulator runs produce ----

/// A xorshift generator, for big histories without proptest's shrinking.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A register history of about `n` operations by `clients` clients, each
/// overlapping several others, some clients crashing mid-operation.
fn big_register_history(seed: u64, clients: usize, n: usize, unique: bool) -> Vec<RegOp> {
    let mut rng = XorShift(seed | 1);
    let mut fresh = 0;
    let specs: Vec<ClientSpec> = (0..clients)
        .map(|_| {
            let ops = (0..n / clients)
                .map(|_| {
                    fresh += 1;
                    let value = if unique { fresh } else { rng.below(8) };
                    (rng.below(2) == 0, value, rng.below(3), rng.below(6), rng.below(6))
                })
                .collect();
            (ops, rng.below(4) == 0, rng.below(2) == 0)
        })
        .collect();
    execute_register(&specs)
}

#[test]
fn large_histories_check_within_the_default_budget() {
    for (seed, clients) in [(1, 8), (2, 8), (3, 16), (4, 16)] {
        let mut h = big_register_history(seed, clients, 300, std::env::var("UNIQ").is_ok());
        let res = check(&Register::default(), &h);
        assert!(res.is_linearizable(), "seed {seed}: {res}");
        let i = h.iter().rposition(|op| op.input == Read && !op.is_pending()).unwrap();
        h[i].response.as_mut().unwrap().output = Value(1_000);
        let res = check(&Register::default(), &h);
        assert!(res.is_violation(), "seed {seed}: {res} mutated {i} {:?}", h[i]);
    }
}

/// Makes the last completed read of a history of unique values return the
/// value of a write overwritten by another completed before the read began.
fn stale_read(h: &mut [RegOp]) {
    let ret = |op: &RegOp| op.response.as_ref().map_or(u64::MAX, |r| r.at);
    let writes: Vec<usize> = (0..h.len()).filter(|&i| matches!(h[i].input, Write(_))).collect();
    for r in (0..h.len()).rev() {
        if h[r].input != Read || h[r].is_pending() {
            continue;
        }
        let newer = writes.iter().filter(|&&n| ret(&h[n]) < h[r].call).map(|&n| h[n].call).max();
        let Some(newer_call) = newer else { continue };
        let Some(&old) = writes.iter().rev().find(|&&o| ret(&h[o]) < newer_call) else { continue };
        let Write(v) = h[old].input else { unreachable!() };
        h[r].response.as_mut().unwrap().output = Value(v);
        return;
    }
    panic!("no read to make stale");
}

/// Prints how long large histories take, linearizable and not (a read of
/// a value never written, or, with unique values, a stale read); run with
/// `cargo test --release -p swarm-lincheck -- --ignored --nocapture`
/// (`BUDGET=n` sets the checker's budget).
#[cfg(feature = "std")]
#[test]
#[ignore = "timing report"]
fn timing_of_large_histories() {
    use core::time::Duration;
    use std::time::Instant;
    let budget = std::env::var("BUDGET").map_or(Checker::DEFAULT_MAX_STEPS, |b| b.parse().unwrap());
    for unique in [false, true] {
        for clients in [4, 8, 16] {
            for n in [100, 300, 1000] {
                let runs = 50;
                let (mut total, mut worst) = ([Duration::ZERO; 2], [Duration::ZERO; 2]);
                let mut unknown = [0; 2];
                for seed in 0..runs {
                    let mut h = big_register_history(seed + 1, clients, n, unique);
                    for mutated in [false, true] {
                        if mutated && !unique {
                            let i = h.iter().rposition(|op| op.input == Read && !op.is_pending()).unwrap();
                            h[i].response.as_mut().unwrap().output = Value(1_000_000);
                        } else if mutated {
                            // A stale read: of a value overwritten before it.
                            stale_read(&mut h);
                        }
                        let t = Instant::now();
                        let res = Checker::new().max_steps(budget).check(&Register::default(), &h);
                        let took = t.elapsed();
                        if res.is_unknown() {
                            unknown[mutated as usize] += 1;
                        } else {
                            assert_eq!(res.is_violation(), mutated, "{res}");
                        }
                        total[mutated as usize] += took;
                        worst[mutated as usize] = worst[mutated as usize].max(took);
                    }
                }
                std::println!(
                    "{n:>4} ops {clients:>2} clients unique {unique:5}: valid mean {:>10.3?} worst {:>10.3?} unknown {} | \
                     mutated mean {:>10.3?} worst {:>10.3?} unknown {}",
                    total[0] / runs as u32,
                    worst[0],
                    unknown[0],
                    total[1] / runs as u32,
                    worst[1],
                    unknown[1],
                );
            }
        }
    }
}

/// A tiny register history whose writes write distinct values (1, 2, ...)
/// and whose reads answer arbitrary values (some never written).
fn unique_register_history() -> impl Strategy<Value = Vec<RegOp>> {
    let op = (0..3u32, 0..10u64, 0..5u64, any::<bool>(), 0..5u64, prop::option::weighted(0.85, Just(())));
    prop::collection::vec(op, 0..8).prop_map(|ops| {
        ops.into_iter()
            .enumerate()
            .map(|(i, (client, call, len, is_write, v, done))| {
                let input = if is_write { Write(i as u64 + 1) } else { Read };
                match done {
                    Some(()) => {
                        Operation::completed(client, call, call + len, input, if is_write { Ack } else { Value(v) })
                    }
                    None => Operation::pending(client, call, input),
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]
    /// The zones never prove a history that brute force finds not
    /// linearizable, and prove every linearizable one without ties.
    #[test]
    fn zones_agree_with_brute_force(h in unique_register_history()) {
        let refs: Vec<&RegOp> = h.iter().collect();
        let proven = zones::proves_linearizable(0, &refs);
        let truth = brute_force(&Register::default(), &h);
        prop_assert!(!proven || truth, "zones proved a violation linearizable");
        let ties = h.iter().any(|a| h.iter().any(|b| a.response.as_ref().is_some_and(|r| r.at == b.call)));
        if truth && !ties {
            prop_assert!(proven, "zones missed a linearizable history");
        }
    }
}

fn res_is_hard(h: &[RegOp]) -> bool {
    let mut ops = h.to_vec();
    // Two equal writes disable the zones; the search alone runs out.
    ops.push(Operation::completed(99, 0, 1, Write(0), Ack));
    Checker::new().max_steps(1_000).check(&Register::default(), &ops).is_unknown()
}

/// The histories that made the search give up (40 writers on one register
/// in the simulator) are settled at once.
#[test]
fn many_concurrent_writes_with_distinct_values_are_settled_at_once() {
    let mut h = big_register_history(7, 44, 400, true);
    // The same order of events, without ties (the executor's times are
    // small integers): touching intervals stay concurrent.
    for op in &mut h {
        op.call *= 10;
        if let Some(r) = op.response.as_mut() {
            r.at = r.at * 10 + 5;
        }
    }
    assert!(res_is_hard(&h), "the search alone gives up on it");
    let res = Checker::new().max_steps(1_000).check(&Register::default(), &h);
    assert!(res.is_linearizable(), "{res}");
}
