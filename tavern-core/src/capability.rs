//! Which context modes a host can support, computed from what the host reports about itself.

use serde::{Deserialize, Serialize};

use crate::binding::ContextMode;

/// Facts a host reports. Unknown means `false`: a capability is never assumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    /// Host name and version, for readable reasons (e.g. `dsh 0.1.0-rc.6`).
    pub host: String,
    /// The host offers a per-request `agent/context` projection seam.
    pub agent_context_seam: bool,
    /// Host compaction measures the effective (projected) request, not the whole surface.
    pub projection_aware_compaction: bool,
    /// The host can suppress pressure compaction for one session.
    pub session_compaction_suppression: bool,
}

impl HostFacts {
    /// A host that reports nothing: no seam, no compaction cooperation (every capability
    /// that depends on one is unavailable).
    pub fn bare(host: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            agent_context_seam: false,
            projection_aware_compaction: false,
            session_compaction_suppression: false,
        }
    }
}

/// Whether something can be used, and if not, why (a sentence for the user).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Availability {
    /// Usable.
    Available,
    /// Not usable, with the reason.
    Unavailable {
        /// Lowercase explanation naming what the host lacks.
        reason: String,
    },
}

impl Availability {
    /// Whether it is available.
    pub fn is_available(&self) -> bool {
        matches!(self, Self::Available)
    }
}

/// AgentTavern's capabilities on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTavernCapabilities {
    /// `dsh-native`: needs nothing beyond a host loop.
    pub native: Availability,
    /// `agent-managed`: needs the `agent/context` seam and compaction that respects projections.
    pub managed: Availability,
}

impl AgentTavernCapabilities {
    /// Computes capabilities from host facts.
    pub fn from_host(facts: &HostFacts) -> Self {
        let managed = if !facts.agent_context_seam {
            Availability::Unavailable {
                reason: format!(
                    "{} has no agent/context seam, so per-request history projection is impossible",
                    facts.host
                ),
            }
        } else if !(facts.projection_aware_compaction || facts.session_compaction_suppression) {
            Availability::Unavailable {
                reason: format!(
                    "{} compacts on the whole surface and cannot suppress compaction per session, \
                     so projected history could be compacted away early",
                    facts.host
                ),
            }
        } else {
            Availability::Available
        };
        Self {
            native: Availability::Available,
            managed,
        }
    }

    /// Availability of one mode.
    pub fn for_mode(&self, mode: ContextMode) -> &Availability {
        match mode {
            ContextMode::DshNative => &self.native,
            ContextMode::AgentManaged => &self.managed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsh_rc6_has_native_but_not_managed() {
        let caps = AgentTavernCapabilities::from_host(&HostFacts::bare("dsh 0.1.0-rc.6"));
        assert!(caps.native.is_available());
        let Availability::Unavailable { reason } = &caps.managed else {
            panic!("managed must be unavailable on rc.6");
        };
        assert!(reason.contains("agent/context"), "{reason}");
    }

    #[test]
    fn seam_without_compaction_cooperation_is_not_enough() {
        let facts = HostFacts {
            agent_context_seam: true,
            ..HostFacts::bare("dsh 0.1.0-rc.6")
        };
        let caps = AgentTavernCapabilities::from_host(&facts);
        assert!(!caps.managed.is_available());
        for (aware, suppress) in [(true, false), (false, true), (true, true)] {
            let facts = HostFacts {
                agent_context_seam: true,
                projection_aware_compaction: aware,
                session_compaction_suppression: suppress,
                ..HostFacts::bare("dsh 0.1.0-rc.6")
            };
            assert!(AgentTavernCapabilities::from_host(&facts)
                .managed
                .is_available());
        }
    }
}
