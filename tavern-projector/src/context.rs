//! Context projection for `agent-managed` sessions: a pure, deterministic choice of which
//! surface nodes a request includes, within a token budget split into kernel, recent,
//! retrieved and reply shares. Non-destructive: it only selects; the surface is untouched.
//!
//! Invariants (each a property test): every required seq is included; an assistant tool call
//! and its tool results are included together or not at all; the result stays within budget
//! unless the required set alone exceeds it (then `over_budget` says so); the kernel share is
//! reserved first and never crowded out; the output is deterministic; a larger budget never
//! drops a node a smaller budget kept.

use serde::{Deserialize, Serialize};
use serde_json::json;
use tavern_core::Revision;

/// What a node is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum NodeRole {
    /// A user message.
    User,
    /// An assistant message; `tool_calls` lists the call ids it made.
    Assistant {
        /// Call ids of its tool calls.
        tool_calls: Vec<String>,
    },
    /// A tool result answering `call_id`.
    Tool {
        /// The call it answers.
        call_id: String,
    },
    /// Anything else on the surface (runtime context, summaries).
    Other,
}

/// One surface node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SurfaceNode {
    /// Its seq in the session log.
    pub seq: u64,
    /// What it is.
    pub role: NodeRole,
    /// Estimated tokens.
    pub tokens: usize,
    /// Relevance to the current request, 0 to 1.
    pub relevance: f64,
    /// Importance, 0 to 1.
    pub importance: f64,
    /// Whether its content is trusted (user and assistant text) rather than retrieved data.
    pub trusted: bool,
}

/// The budget: `total` tokens of context window, of which `kernel` and `reply` are reserved;
/// the rest after required nodes is split between recent history (`recent_share`, 0 to 1) and
/// retrieved older nodes (the remainder).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// The whole window.
    pub total: usize,
    /// Reserved for the kernel prompt, first.
    pub kernel: usize,
    /// Reserved for the reply.
    pub reply: usize,
    /// Share of the free space for the most recent nodes.
    pub recent_share: f64,
}

/// A projection request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectionInput {
    /// The current surface, in seq order.
    pub nodes: Vec<SurfaceNode>,
    /// Seqs that must be included (the step's user messages, an unfinished tool unit).
    pub required: Vec<u64>,
    /// The budget.
    pub budget: Budget,
    /// The surface generation the nodes were read at.
    pub surface_generation: u64,
}

/// The chosen nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    /// Seqs to include, ascending, unique, a subset of the input nodes.
    pub include: Vec<u64>,
    /// Tokens of the included nodes.
    pub used_tokens: usize,
    /// Whether the required nodes alone exceed the space left after kernel and reply.
    pub over_budget: bool,
    /// Content revision of this projection.
    pub revision: Revision,
}

/// What a host logs as `request/projection` so a request can be rebuilt from the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionRecord {
    /// Turn.
    pub turn: u64,
    /// Step.
    pub step: u64,
    /// The surface generation the projection was computed against.
    pub surface_generation: u64,
    /// The included seqs.
    pub include: Vec<u64>,
    /// The projection's revision.
    pub revision: Revision,
}

impl ProjectionRecord {
    /// The record for a projection.
    pub fn new(turn: u64, step: u64, surface_generation: u64, p: &Projection) -> Self {
        Self {
            turn,
            step,
            surface_generation,
            include: p.include.clone(),
            revision: p.revision.clone(),
        }
    }

    /// Refuses a projection computed against an older surface (the host replaced the surface
    /// while projecting): recompute or reject the step.
    ///
    /// # Errors
    /// A message naming both generations.
    pub fn check_fresh(&self, current_generation: u64) -> Result<(), String> {
        if self.surface_generation == current_generation {
            Ok(())
        } else {
            Err(format!(
                "stale projection: computed against surface generation {}, the surface is now at {current_generation}; recompute",
                self.surface_generation
            ))
        }
    }
}

/// Per-unit aggregates: an assistant message with its tool results forms one unit.
struct Units {
    /// Unit of each node.
    of_node: Vec<u32>,
    tokens: Vec<usize>,
    score: Vec<f64>,
    required: Vec<bool>,
}

/// Groups nodes into units that stay together and scores each unit by relevance,
/// importance, recency and trust (all from its members).
fn units(input: &ProjectionInput) -> Units {
    let nodes = &input.nodes;
    let mut owner: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let mut of_node = Vec::with_capacity(nodes.len());
    let mut first_seq: Vec<u64> = Vec::new();
    let mut tokens: Vec<usize> = Vec::new();
    let mut rel: Vec<f64> = Vec::new();
    let mut imp: Vec<f64> = Vec::new();
    let mut trusted: Vec<bool> = Vec::new();
    let mut required: Vec<bool> = Vec::new();
    let required_seqs: std::collections::HashSet<u64> = input.required.iter().copied().collect();
    for n in nodes {
        let existing = match &n.role {
            NodeRole::Tool { call_id } => owner.get(call_id.as_str()).copied(),
            _ => None,
        };
        let u = match existing {
            Some(u) => u,
            None => {
                let u = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
                first_seq.push(n.seq);
                tokens.push(0);
                rel.push(0.0);
                imp.push(0.0);
                trusted.push(true);
                required.push(false);
                u
            }
        };
        if let NodeRole::Assistant { tool_calls } = &n.role {
            for id in tool_calls {
                owner.insert(id.as_str(), u);
            }
        }
        let k = u as usize;
        tokens[k] += n.tokens;
        rel[k] = rel[k].max(n.relevance);
        imp[k] = imp[k].max(n.importance);
        trusted[k] &= n.trusted;
        required[k] |= required_seqs.contains(&n.seq);
        of_node.push(u);
    }
    let newest = nodes.last().map_or(0, |n| n.seq).max(1) as f64;
    let score = (0..tokens.len())
        .map(|k| {
            let trust = if trusted[k] { 1.0 } else { 0.0 };
            0.5 * rel[k] + 0.2 * imp[k] + 0.2 * (first_seq[k] as f64 / newest) + 0.1 * trust
        })
        .collect();
    Units {
        of_node,
        tokens,
        score,
        required,
    }
}

/// Chooses the nodes of one request.
pub fn project(input: &ProjectionInput) -> Projection {
    let nodes = &input.nodes;
    let units = units(input);
    let n_units = units.tokens.len();
    let tokens = &units.tokens;
    let mut chosen = units.required.clone();

    let b = input.budget;
    let space = b.total.saturating_sub(b.kernel).saturating_sub(b.reply);
    let required_tokens: usize = (0..n_units).filter(|u| chosen[*u]).map(|u| tokens[u]).sum();
    let over_budget = required_tokens > space;
    if !over_budget {
        let free = space - required_tokens;
        let share = b.recent_share.clamp(0.0, 1.0);
        // Floor keeps the two shares within `free` together.
        let recent_budget = (free as f64 * share).floor() as usize;
        let retrieved_budget = free - recent_budget;
        // Recent: newest first, stop at the first unit that does not fit (a prefix, so a larger
        // budget only extends it).
        let mut used = 0usize;
        for u in (0..n_units).rev() {
            if chosen[u] {
                continue;
            }
            if used + tokens[u] > recent_budget {
                break;
            }
            used += tokens[u];
            chosen[u] = true;
        }
        // Retrieved: the rest by score (ties: newer first), same prefix rule over that fixed
        // order. A heap yields the order lazily; the walk usually stops early.
        let key = |u: usize| {
            let bits = units.score[u].to_bits();
            // Order-preserving map of f64 to u64 (scores are finite and non-negative).
            let ordered = if units.score[u].is_sign_negative() {
                !bits
            } else {
                bits | (1 << 63)
            };
            (ordered, u)
        };
        let mut heap: std::collections::BinaryHeap<(u64, usize)> =
            (0..n_units).filter(|u| !chosen[*u]).map(key).collect();
        let mut used = 0usize;
        while let Some((_, u)) = heap.pop() {
            if used + tokens[u] > retrieved_budget {
                break;
            }
            used += tokens[u];
            chosen[u] = true;
        }
    }
    let mut include: Vec<u64> = nodes
        .iter()
        .zip(&units.of_node)
        .filter(|(_, u)| chosen[**u as usize])
        .map(|(n, _)| n.seq)
        .collect();
    include.sort_unstable();
    include.dedup();
    let used_tokens = (0..n_units).filter(|u| chosen[*u]).map(|u| tokens[u]).sum();
    let revision = Revision::compute(
        "projection",
        None,
        &json!({"generation": input.surface_generation, "include": include}),
    );
    Projection {
        include,
        used_tokens,
        over_budget,
        revision,
    }
}
