//! Who speaks in a chat, as SillyTavern names them: the card's display name (`Seraphina`,
//! though its file is `default_Seraphina.png`) and the chat's persona (its lock, else the
//! user's default). Projected lines, greetings and the kernel all ask here, so a chat the user
//! continues from a host reads as if SillyTavern had written every line.

use std::sync::Arc;

use tavern_core::SessionBinding;
use tavern_projector::{SpeakerNames, Speakers};
use tavern_store::AllStores;
use tavern_tools::assets::provider::{AssetProvider, Persona};

/// Resolves speakers from the stores (the chat's header) and the assets (cards, personas).
pub(crate) struct ChatSpeakers {
    pub(crate) stores: Arc<dyn AllStores>,
    pub(crate) assets: Arc<dyn AssetProvider>,
    /// The configured user name, for a chat with no persona.
    pub(crate) user_name: String,
}

impl ChatSpeakers {
    /// The chat's persona: its lock (from the chat's header), else the user's default; the
    /// configured user name when the persona has none.
    pub(crate) async fn persona(&self, binding: &SessionBinding) -> Persona {
        let target = binding.target();
        let head = self
            .stores
            .read_chat_head(&target.character, &target.chat_id)
            .await
            .ok()
            .flatten();
        let mut persona = self
            .assets
            .chat_persona(tavern_tools::assets::personas::persona_lock(head.as_ref()))
            .await;
        if persona.name.trim().is_empty() {
            persona.name.clone_from(&self.user_name);
        }
        persona
    }

    /// The card's display name, else the character id.
    pub(crate) async fn character_name(&self, binding: &SessionBinding) -> String {
        let character = &binding.target().character;
        match self.assets.card(character).await {
            Ok(Some(card)) if !card.name().trim().is_empty() => card.name().to_owned(),
            _ => character.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl SpeakerNames for ChatSpeakers {
    async fn speakers(&self, binding: &SessionBinding) -> Speakers {
        Speakers {
            user: self.persona(binding).await.name,
            character: self.character_name(binding).await,
        }
    }
}
