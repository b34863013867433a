//! Properties of the agent-managed context projection over random surfaces.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::*;
use tavern_projector::context::{
    project, Budget, NodeRole, ProjectionInput, ProjectionRecord, SurfaceNode,
};

/// A random surface: user messages, plain assistant messages, and assistant tool calls followed
/// by their results (sometimes interleaved with other nodes).
fn surface() -> impl Strategy<Value = Vec<SurfaceNode>> {
    prop::collection::vec(
        (
            0..4u8,
            1..3usize,
            1..200usize,
            0.0..1.0f64,
            0.0..1.0f64,
            any::<bool>(),
        ),
        0..40,
    )
    .prop_map(|spec| {
        let mut nodes = Vec::new();
        let mut seq = 0u64;
        let mut call = 0;
        let mut node = |role, tokens, relevance, importance, trusted| {
            seq += 1;
            SurfaceNode {
                seq,
                role,
                tokens,
                relevance,
                importance,
                trusted,
            }
        };
        for (kind, calls, tokens, rel, imp, trusted) in spec {
            match kind {
                0 => nodes.push(node(NodeRole::User, tokens, rel, imp, true)),
                1 => nodes.push(node(
                    NodeRole::Assistant { tool_calls: vec![] },
                    tokens,
                    rel,
                    imp,
                    true,
                )),
                2 => {
                    let ids: Vec<String> = (0..calls)
                        .map(|_| {
                            call += 1;
                            format!("c{call}")
                        })
                        .collect();
                    nodes.push(node(
                        NodeRole::Assistant {
                            tool_calls: ids.clone(),
                        },
                        tokens,
                        rel,
                        imp,
                        true,
                    ));
                    for id in ids {
                        nodes.push(node(
                            NodeRole::Tool { call_id: id },
                            tokens / 2 + 1,
                            rel,
                            imp,
                            trusted,
                        ));
                    }
                }
                _ => nodes.push(node(NodeRole::Other, tokens, rel, imp, false)),
            }
        }
        nodes
    })
}

fn input(
    nodes: Vec<SurfaceNode>,
    required_pick: &[usize],
    total: usize,
    kernel: usize,
    reply: usize,
    share: f64,
) -> ProjectionInput {
    let required = if nodes.is_empty() {
        vec![]
    } else {
        required_pick
            .iter()
            .map(|i| nodes[i % nodes.len()].seq)
            .collect()
    };
    ProjectionInput {
        nodes,
        required,
        budget: Budget {
            total,
            kernel,
            reply,
            recent_share: share,
        },
        surface_generation: 7,
    }
}

/// Tool units: assistant seq → member seqs.
fn tool_units(nodes: &[SurfaceNode]) -> Vec<BTreeSet<u64>> {
    let mut owner: HashMap<&str, usize> = HashMap::new();
    let mut units: Vec<BTreeSet<u64>> = Vec::new();
    for n in nodes {
        match &n.role {
            NodeRole::Assistant { tool_calls } if !tool_calls.is_empty() => {
                units.push(BTreeSet::from([n.seq]));
                for id in tool_calls {
                    owner.insert(id, units.len() - 1);
                }
            }
            NodeRole::Tool { call_id } => {
                if let Some(u) = owner.get(call_id.as_str()) {
                    units[*u].insert(n.seq);
                }
            }
            _ => {}
        }
    }
    units
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold(
        nodes in surface(),
        required in prop::collection::vec(any::<usize>(), 0..3),
        total in 0..6000usize, kernel in 0..800usize, reply in 0..800usize, share in 0.0..1.0f64,
        extra in 1..3000usize,
    ) {
        let inp = input(nodes.clone(), &required, total, kernel, reply, share);
        let p = project(&inp);
        let seqs: BTreeSet<u64> = nodes.iter().map(|n| n.seq).collect();
        // Ascending, unique, a subset.
        prop_assert!(p.include.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(p.include.iter().all(|s| seqs.contains(s)));
        let inc: BTreeSet<u64> = p.include.iter().copied().collect();
        // Required always included.
        prop_assert!(inp.required.iter().all(|r| inc.contains(r)));
        // Tool units whole or absent.
        for unit in tool_units(&nodes) {
            let n = unit.iter().filter(|s| inc.contains(s)).count();
            prop_assert!(n == 0 || n == unit.len(), "split unit {unit:?} in {inc:?}");
        }
        // Token accounting and budget (kernel reserved first).
        let used: usize = nodes.iter().filter(|n| inc.contains(&n.seq)).map(|n| n.tokens).sum();
        prop_assert_eq!(used, p.used_tokens);
        let space = total.saturating_sub(kernel).saturating_sub(reply);
        if p.over_budget {
            prop_assert!(used > space, "over_budget only when required alone does not fit");
        } else {
            prop_assert!(used <= space);
        }
        // Deterministic.
        prop_assert_eq!(&project(&inp), &p);
        // Monotone in the budget.
        let bigger = project(&input(nodes, &required, total + extra, kernel, reply, share));
        if !p.over_budget {
            let big: BTreeSet<u64> = bigger.include.iter().copied().collect();
            prop_assert!(inc.is_subset(&big), "a larger budget dropped {:?}", inc.difference(&big).collect::<Vec<_>>());
        }
    }
}

#[test]
fn recent_history_and_relevant_old_nodes_are_chosen() {
    let node = |seq, tokens, relevance| SurfaceNode {
        seq,
        role: NodeRole::User,
        tokens,
        relevance,
        importance: 0.0,
        trusted: true,
    };
    let nodes = vec![
        node(1, 100, 0.9),
        node(2, 100, 0.0),
        node(3, 100, 0.1),
        node(4, 100, 0.0),
        node(5, 50, 0.0),
    ];
    let inp = ProjectionInput {
        nodes,
        required: vec![5],
        budget: Budget {
            total: 500,
            kernel: 100,
            reply: 100,
            recent_share: 0.5,
        },
        surface_generation: 3,
    };
    let p = project(&inp);
    // 300 free: required 50, then 125 recent (seq 4), then 125 retrieved (most relevant: seq 1).
    assert_eq!(p.include, [1, 4, 5]);
    assert!(!p.over_budget);
    let record = ProjectionRecord::new(2, 1, 3, &p);
    assert!(record.check_fresh(3).is_ok());
    assert!(record.check_fresh(4).unwrap_err().contains("generation 3"));
    let tiny = ProjectionInput {
        budget: Budget {
            total: 220,
            ..inp.budget
        },
        ..inp
    };
    let p = project(&tiny);
    assert_eq!(p.include, [5]);
    assert!(p.over_budget, "50 required tokens do not fit in 20");
}
