use super::*;

#[test]
fn seq_bytes_keeps_calls_in_order_and_pops_those_below_a_limit() {
    let mut m = SeqBytes::default();
    assert_eq!(m.first(), None);
    m.add(5, 10);
    m.add(7, 1);
    m.add(5, 2);
    m.add(3, 4); // out of order
    m.add(6, 8);
    m.add(7, 1);
    assert_eq!(m.0, [(3, 4), (5, 12), (6, 8), (7, 2)]);
    assert_eq!(m.first(), Some(3));
    assert_eq!(m.pop_below(6), 16);
    assert_eq!(m.first(), Some(6));
    assert_eq!(m.pop_below(6), 0);
    assert_eq!(m.pop_below(100), 10);
    assert_eq!(m.first(), None);
}

fn sends(out: &[FlowOut<u32>]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| {
            if let FlowOut::Send(m) = o {
                Some(*m)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn holds_beyond_the_window_and_releases_on_credit() {
    let mut f = Flow::new(4, u64::MAX);
    let mut out = Vec::new();
    for seq in 0..10 {
        f.send(1, seq, 0, seq as u32, &mut out);
    }
    assert_eq!(sends(&out), vec![0, 1, 2, 3]);
    assert_eq!(f.held(), 6);
    assert!(out.contains(&FlowOut::Ask { peer: 1, seq: 4 }));
    out.clear();
    f.on_credit(1, 3, &mut out);
    assert_eq!(sends(&out), vec![4, 5, 6]);
    assert!(out.contains(&FlowOut::Ask { peer: 1, seq: 7 }));
    out.clear();
    f.on_credit(1, 2, &mut out);
    assert!(out.is_empty(), "stale credit ignored");
    f.on_credit(1, 100, &mut out);
    assert_eq!(sends(&out), vec![7, 8, 9]);
    assert_eq!(f.held(), 0);
}

#[test]
fn receiver_answers_now_and_again_when_it_catches_up() {
    let mut f: Flow<u32> = Flow::new(4, u64::MAX);
    let mut out = Vec::new();
    f.on_want(0, 9, &mut out);
    assert_eq!(out, vec![FlowOut::Credit { peer: 0, calls: 0 }]);
    out.clear();
    for seq in 0..5 {
        f.on_made(seq, &mut out);
    }
    assert!(out.is_empty(), "9 is not yet within 5 + 4");
    f.on_made(5, &mut out);
    assert_eq!(out, vec![FlowOut::Credit { peer: 0, calls: 6 }]);
    assert!(f.admits(9) && !f.admits(10));
}

#[test]
fn the_receiver_answers_for_the_lowest_call_asked_about() {
    let mut f: Flow<u32> = Flow::new(2, u64::MAX);
    let mut out = Vec::new();
    f.on_want(0, 9, &mut out);
    f.on_want(0, 4, &mut out);
    out.clear();
    for seq in 0..2 {
        f.on_made(seq, &mut out);
    }
    assert!(out.is_empty(), "4 is not yet within 2 + 2");
    f.on_made(2, &mut out);
    assert_eq!(out, vec![FlowOut::Credit { peer: 0, calls: 3 }]);
}

#[test]
fn the_receiver_answers_the_last_call_asked_about_not_only_the_lowest() {
    // The sender asks about 9, then (its early ask, for a message it sent ahead) about 10,
    // and waits for the answer to 10. The credit that answers 9 does not answer 10: the
    // receiver must answer 10 too once it fits (a root running ahead of a peer hung on
    // this in the bench: its held broadcasts waited for an answer that never came).
    let mut f: Flow<u32> = Flow::new(4, u64::MAX);
    let mut out = Vec::new();
    f.on_want(0, 9, &mut out);
    f.on_want(0, 10, &mut out);
    out.clear();
    for seq in 0..6 {
        f.on_made(seq, &mut out);
    }
    assert_eq!(out, vec![FlowOut::Credit { peer: 0, calls: 6 }], "9 fits");
    out.clear();
    f.on_made(6, &mut out);
    assert_eq!(out, vec![FlowOut::Credit { peer: 0, calls: 7 }], "10 fits");
    out.clear();
    f.on_made(7, &mut out);
    assert!(out.is_empty(), "nothing asked any more");
}

#[test]
fn an_older_call_held_after_a_newer_one_is_asked_about() {
    let mut f = Flow::new(1, u64::MAX);
    let mut out = Vec::new();
    f.send(1, 5, 0, 5u32, &mut out);
    assert_eq!(out, vec![FlowOut::Ask { peer: 1, seq: 5 }]);
    out.clear();
    f.send(1, 3, 0, 3, &mut out);
    assert_eq!(out, vec![FlowOut::Ask { peer: 1, seq: 3 }]);
    out.clear();
    f.send(1, 7, 0, 7, &mut out);
    assert!(out.is_empty(), "7 is above the call asked about");
    f.on_credit(1, 3, &mut out);
    assert_eq!(sends(&out), vec![3]);
    assert!(out.contains(&FlowOut::Ask { peer: 1, seq: 5 }));
}

#[test]
fn the_early_ask_comes_at_half_window_and_names_half_a_window_ahead() {
    let mut f = Flow::new(8, u64::MAX);
    let mut out = Vec::new();
    for seq in 0..4 {
        f.send(1, seq, 0, seq as u32, &mut out);
    }
    assert_eq!(sends(&out), vec![0, 1, 2, 3]);
    assert_eq!(out.len(), 4, "no ask below half a window: {out:?}");
    out.clear();
    f.send(1, 4, 0, 4, &mut out);
    assert_eq!(
        out,
        vec![FlowOut::Send(4), FlowOut::Ask { peer: 1, seq: 8 }]
    );
    out.clear();
    // Known calls move the half-window mark: nothing to ask below it.
    f.on_credit(1, 4, &mut out);
    out.clear();
    f.send(1, 6, 0, 6, &mut out);
    assert_eq!(out, vec![FlowOut::Send(6)]);
    out.clear();
    f.send(1, 8, 0, 8, &mut out);
    assert_eq!(
        out,
        vec![FlowOut::Send(8), FlowOut::Ask { peer: 1, seq: 12 }]
    );
    out.clear();
    // A second message of the same call asks nothing new; the next call asks further.
    let mut g = Flow::new(8, u64::MAX);
    g.send(1, 4, 0, 4u32, &mut out);
    out.clear();
    g.send(1, 4, 0, 40, &mut out);
    assert_eq!(out, vec![FlowOut::Send(40)]);
    out.clear();
    g.send(1, 5, 0, 5, &mut out);
    assert_eq!(
        out,
        vec![FlowOut::Send(5), FlowOut::Ask { peer: 1, seq: 9 }]
    );
    out.clear();
    // An ask already out for a later call is not repeated.
    g.asked_for_test(1, 20);
    g.send(1, 5, 0, 5, &mut out);
    assert_eq!(out, vec![FlowOut::Send(5)]);
}

#[test]
fn ranks_in_step_ask_early_and_never_hold() {
    // Two ranks making the same calls, each crediting the other as asked.
    let mut a: Flow<u64> = Flow::new(8, u64::MAX);
    let mut b: Flow<u64> = Flow::new(8, u64::MAX);
    for seq in 0..100 {
        let mut out = Vec::new();
        b.on_made(seq, &mut out);
        a.on_made(seq, &mut out);
        a.send(1, seq, 0, seq, &mut out);
        let mut replies = Vec::new();
        for o in out {
            if let FlowOut::Ask { seq, .. } = o {
                b.on_want(0, seq, &mut replies);
            }
        }
        for r in replies {
            if let FlowOut::Credit { calls, .. } = r {
                a.on_credit(1, calls, &mut Vec::new());
            }
        }
        assert_eq!(a.held(), 0, "seq {seq}");
    }
}

#[test]
fn bytes_beyond_the_budget_wait_for_the_peers_call_then_go() {
    // Window 4, budget 100 bytes: call 0's 60 bytes go ahead; call 1's 60 would make 120.
    let mut f = Flow::new(4, 100);
    let mut out = Vec::new();
    f.send(1, 0, 60, 0u32, &mut out);
    // Over half the budget ahead: it asks about call 0 + window, whose answer comes once
    // the peer has made call 0.
    assert_eq!(
        out,
        vec![FlowOut::Send(0), FlowOut::Ask { peer: 1, seq: 4 }]
    );
    out.clear();
    f.send(1, 1, 60, 1, &mut out);
    assert!(
        out.is_empty(),
        "held, and the ask about call 0 is out: {out:?}"
    );
    // A message larger than the whole budget waits too, and nothing of it goes ahead.
    f.send(1, 2, 500, 2, &mut out);
    assert!(sends(&out).is_empty());
    // The peer made call 0: call 0's bytes are not ahead any more; call 1's 60 go ahead.
    f.on_credit(1, 1, &mut out);
    assert_eq!(sends(&out), vec![1]);
    assert!(out.contains(&FlowOut::Ask { peer: 1, seq: 6 }), "{out:?}");
    out.clear();
    // The peer made call 2: everything below goes, the 500 bytes included (not ahead).
    f.on_credit(1, 3, &mut out);
    assert_eq!(sends(&out), vec![2]);
    assert_eq!(f.held(), 0);
    // Calls the peer is known to have made are never counted.
    out.clear();
    f.send(1, 0, 1 << 40, 9, &mut out);
    assert_eq!(sends(&out), vec![9]);
}

#[test]
fn half_the_budget_ahead_asks_early() {
    let mut f = Flow::new(16, 100);
    let mut out = Vec::new();
    f.send(1, 0, 40, 0u32, &mut out);
    assert_eq!(out, vec![FlowOut::Send(0)]);
    out.clear();
    f.send(1, 0, 20, 1, &mut out);
    assert_eq!(
        out,
        vec![FlowOut::Send(1), FlowOut::Ask { peer: 1, seq: 16 }]
    );
    out.clear();
    // Not again while that ask is out.
    f.send(1, 1, 10, 2, &mut out);
    assert_eq!(out, vec![FlowOut::Send(2)]);
}

#[test]
fn the_receiver_counts_early_bytes_until_it_makes_their_call() {
    let mut f: Flow<u32> = Flow::new(4, 100);
    let mut out = Vec::new();
    assert_eq!(f.early(1, 0, 60), Ok(()));
    assert_eq!(f.early(2, 0, 60), Ok(()), "per peer");
    assert_eq!(f.early(1, 1, 41), Err(101));
    assert_eq!(f.early(1, 1, 40), Ok(()));
    f.on_made(0, &mut out);
    // Call 0's 60 bytes are the call's own now; call 1's 40 still count.
    assert_eq!(f.early(1, 2, 60), Ok(()));
    assert_eq!(f.early(1, 3, 1), Err(101));
}

#[test]
fn a_conforming_sender_never_trips_the_receivers_count() {
    // Sender 0 runs ahead of receiver 1 with messages of random sizes; the receiver makes
    // its calls late; credits travel with delays. The receiver's count stays within the
    // budget, and everything is sent in the end.
    let (w, budget) = (4u64, 1000u64);
    let mut seed = 7u64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut a: Flow<(u64, u64)> = Flow::new(w, budget);
    let mut b: Flow<(u64, u64)> = Flow::new(w, budget);
    let mut to_b: Vec<FlowOut<(u64, u64)>> = Vec::new();
    let mut to_a: Vec<FlowOut<(u64, u64)>> = Vec::new();
    let (mut made, mut next, mut delivered) = (0u64, 0u64, 0usize);
    let total = 200usize;
    let mut sent_calls = 0u64;
    for _ in 0..100_000 {
        match rnd(4) {
            0 if next < 50 => {
                let mut out = Vec::new();
                for _ in 0..4 {
                    let bytes = rnd(700);
                    a.send(1, next, bytes, (next, bytes), &mut out);
                }
                next += 1;
                sent_calls += 1;
                to_b.extend(out);
            }
            1 if made < sent_calls => {
                let mut out = Vec::new();
                b.on_made(made, &mut out);
                made += 1;
                to_a.extend(out);
            }
            2 if !to_b.is_empty() => {
                let i = rnd(to_b.len() as u64) as usize;
                match to_b.remove(i) {
                    FlowOut::Send((seq, bytes)) => {
                        if seq >= made {
                            assert!(b.early(0, seq, bytes).is_ok(), "tripped at {seq}");
                        }
                        delivered += 1;
                    }
                    FlowOut::Ask { seq, .. } => {
                        let mut out = Vec::new();
                        b.on_want(0, seq, &mut out);
                        to_a.extend(out);
                    }
                    FlowOut::Credit { .. } => {}
                }
            }
            3 if !to_a.is_empty() => {
                if let FlowOut::Credit { calls, .. } = to_a.remove(0) {
                    let mut out = Vec::new();
                    a.on_credit(1, calls, &mut out);
                    to_b.extend(out);
                }
            }
            _ => {}
        }
    }
    assert_eq!(delivered, total, "held: {}", a.held());
}
