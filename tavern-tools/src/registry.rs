//! The tool registry: lists the contracts (in OpenAI function-calling shape for hosts) and
//! executes a call by name with JSON arguments — validating them against the schema, enforcing
//! per-turn call and write limits and the result size. Independent of any host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::tool::Tool;

use serde_json::{json, Value};
use tavern_core::SessionId;
use tavern_search::RankerRef;
use tavern_store::{ChatStore, MemoryStore, VariableStore};

use crate::assets::provider::AssetProvider;
use crate::context::{ToolContext, ToolLimits};
use crate::error::ToolError;
use crate::history::HistoryCache;
use crate::tools::{self, ToolSpec};

/// What the tools read and write.
#[derive(Clone)]
pub struct ToolServices {
    /// Memories.
    pub memory: Arc<dyn MemoryStore>,
    /// Variables.
    pub variables: Arc<dyn VariableStore>,
    /// SillyTavern chats.
    pub chats: Arc<dyn ChatStore>,
    /// Cards, world books, persona.
    pub assets: Arc<dyn AssetProvider>,
    /// Chat history indexes (`tavern_history_search`), kept between calls.
    pub history: HistoryCache,
    /// The ranker memory, history and lore searches hand their lexical candidates through
    /// ([`tavern_search::rank`]; lexical by default).
    pub ranker: RankerRef,
    /// The user's offset from UTC (`{{time}}`, `{{date}}`, and SillyTavern's local-time send
    /// dates for `{{idle_duration}}`); UTC by default.
    pub zone: Arc<dyn tavern_core::UtcOffsets>,
}

impl std::fmt::Debug for ToolServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServices").finish_non_exhaustive()
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct TurnCount {
    turn: u64,
    calls: usize,
    writes: usize,
}

/// Lists and runs the tools.
pub struct ToolRegistry {
    services: ToolServices,
    limits: ToolLimits,
    specs: Vec<ToolSpec>,
    tools: HashMap<&'static str, Arc<dyn Tool>>,
    counts: Mutex<HashMap<SessionId, TurnCount>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ToolRegistry {
    /// A registry over `services` with `limits`.
    pub fn new(services: ToolServices, limits: ToolLimits) -> Self {
        let all = tools::all(&limits);
        Self {
            specs: all.iter().map(|t| t.spec().clone()).collect(),
            tools: all.into_iter().map(|t| (t.spec().name, t)).collect(),
            services,
            limits,
            counts: Mutex::default(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &ToolLimits {
        &self.limits
    }

    /// Whether the tool named `name` writes (`None`: no such tool).
    pub fn writes(&self, name: &str) -> Option<bool> {
        self.tools.get(name).map(|t| t.spec().writes)
    }

    /// Every tool's contract.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The tools as OpenAI-style function definitions:
    /// `[{type: "function", function: {name, description, parameters}}]`.
    pub fn openai_tools(&self) -> Value {
        Value::Array(
            self.specs
                .iter()
                .map(|s| json!({"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.parameters}}))
                .collect(),
        )
    }

    /// Runs one call. Arguments are checked against the tool's schema first (so a forged
    /// `sessionId`, `chatId` or `scopeId` is refused as an unknown argument), then the per-turn
    /// limits, then the tool runs; its result must fit [`ToolLimits::max_result_bytes`].
    ///
    /// # Errors
    /// A [`ToolError`] the model can act on.
    pub async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: &Value,
    ) -> Result<Value, ToolError> {
        self.run(ctx, name, args, true).await
    }

    /// [`ToolRegistry::call`] for a trusted operator surface (the management API's lore
    /// tester): the same checks and limits on arguments and result, but the call is not
    /// counted against the session's per-turn calls, which belong to the model.
    ///
    /// # Errors
    /// As [`ToolRegistry::call`], except the per-turn limits.
    pub async fn call_unmetered(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: &Value,
    ) -> Result<Value, ToolError> {
        self.run(ctx, name, args, false).await
    }

    async fn run(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: &Value,
        metered: bool,
    ) -> Result<Value, ToolError> {
        let tool = self
            .tools
            .get(name)
            .ok_or_else(|| ToolError::UnknownTool(name.to_owned()))?;
        // Arguments first: a forged identity argument is refused before it costs a call.
        // `null` for an optional argument means "not given" (models in strict
        // function-calling modes send every argument, the ones they do not use as null). One
        // copy and one validation per call; the tool gets the checked arguments.
        let args = crate::tool::without_optional_nulls(&tool.spec().parameters, args);
        crate::schema::validate(&tool.spec().parameters, &args)?;
        if metered {
            self.count(ctx, tool.spec().writes)?;
        }
        let out = tool.call(&self.services, ctx, args).await?;
        let size = json_len(&out);
        if size > self.limits.max_result_bytes {
            return Err(ToolError::LimitExceeded {
                limit: "result bytes (ask for fewer results or a smaller maxTokens)".into(),
                max: self.limits.max_result_bytes,
                actual: size,
            });
        }
        Ok(out)
    }

    /// Forgets a session's per-turn counters (the host's turn ended or the agent is gone), so
    /// the counters only ever hold sessions that are mid-turn.
    pub fn end_turn(&self, session: &SessionId) {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
    }

    /// How many sessions have per-turn counters (bounded-memory checks).
    pub fn tracked_sessions(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn count(&self, ctx: &ToolContext, writes: bool) -> Result<(), ToolError> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let c = counts.entry(ctx.session().clone()).or_default();
        if c.turn != ctx.turn() {
            *c = TurnCount {
                turn: ctx.turn(),
                calls: 0,
                writes: 0,
            };
        }
        if c.calls >= self.limits.calls_per_turn {
            return Err(ToolError::LimitExceeded {
                limit: "tool calls per turn".into(),
                max: self.limits.calls_per_turn,
                actual: c.calls + 1,
            });
        }
        // A refused write still spent one of the turn's calls: retry storms stay bounded.
        c.calls += 1;
        if writes && c.writes >= self.limits.writes_per_turn {
            return Err(ToolError::LimitExceeded {
                limit: "writing tool calls per turn".into(),
                max: self.limits.writes_per_turn,
                actual: c.writes + 1,
            });
        }
        if writes {
            c.writes += 1;
        }
        Ok(())
    }
}

/// The length of `value` as compact JSON, counted without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into a counter cannot fail; a value that cannot be encoded counts as huge.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}
