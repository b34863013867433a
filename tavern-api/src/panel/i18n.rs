//! The panel's words in English and Chinese. Every key is a field of [`Words`], so a key that
//! one language lacks does not compile; a test checks no entry is left empty or untranslated.

/// A language of the panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// English.
    En,
    /// 简体中文.
    Zh,
}

impl Lang {
    /// `en` or `zh`.
    pub fn code(self) -> &'static str {
        match self {
            Self::En => "en",
            Self::Zh => "zh",
        }
    }

    /// The HTML `lang` attribute.
    pub fn html(self) -> &'static str {
        match self {
            Self::En => "en",
            Self::Zh => "zh-CN",
        }
    }

    /// The other language (the switch link).
    pub fn other(self) -> Self {
        match self {
            Self::En => Self::Zh,
            Self::Zh => Self::En,
        }
    }

    /// `?lang=` first, then the `tavern_lang` cookie, then `Accept-Language` (Chinese when it
    /// prefers `zh` over English), else English.
    pub fn choose(query: Option<&str>, cookie: Option<&str>, accept: Option<&str>) -> Self {
        let parse = |s: &str| match s.trim() {
            "zh" | "zh-CN" | "zh-cn" => Some(Self::Zh),
            "en" => Some(Self::En),
            _ => None,
        };
        if let Some(l) = query.and_then(parse).or_else(|| cookie.and_then(parse)) {
            return l;
        }
        let accept = accept.unwrap_or("").to_ascii_lowercase();
        let zh = accept.find("zh");
        let en = accept.find("en");
        match (zh, en) {
            (Some(z), Some(e)) if z < e => Self::Zh,
            (Some(_), None) => Self::Zh,
            _ => Self::En,
        }
    }

    /// The words.
    pub fn words(self) -> &'static Words {
        match self {
            Self::En => &EN,
            Self::Zh => &ZH,
        }
    }
}

macro_rules! words {
    ($($key:ident),* $(,)?) => {
        /// Every word the panel shows.
        #[derive(Debug)]
        #[allow(missing_docs)]
        pub struct Words { $(pub $key: &'static str,)* }

        impl Words {
            /// `(key, text)` of every entry.
            pub fn entries(&self) -> Vec<(&'static str, &'static str)> {
                vec![$((stringify!($key), self.$key),)*]
            }
        }
    };
}

words!(
    title,
    nav_overview,
    nav_memories,
    nav_variables,
    nav_lore,
    nav_settings,
    switch_lang,
    sessions,
    session,
    character,
    chat,
    architecture,
    context_mode,
    projection,
    pending,
    pending_count,
    no_sessions,
    mode_control,
    switch_to,
    unavailable_because,
    current_mode,
    fork,
    fork_help,
    new_session,
    new_chat,
    replay,
    replay_help,
    replayed,
    prompt,
    prompt_help,
    save,
    reset,
    saved,
    bind,
    bind_help,
    memories,
    search,
    filter_scope,
    any_scope,
    include_forgotten,
    no_memories,
    content,
    tags,
    importance,
    confidence,
    kind,
    state,
    source,
    updated,
    revision,
    edit,
    forget,
    restore,
    forgotten_note,
    history,
    action,
    at,
    change,
    first_text,
    text_not_kept,
    text_unchanged,
    bring_back,
    changes,
    no_changes,
    turn,
    messages_shown,
    older,
    newer,
    cut,
    conflict_title,
    conflict_help,
    yours,
    current,
    apply_on_current,
    variables,
    name,
    value,
    value_help,
    delete,
    set,
    no_variables,
    lore_tester,
    lore_help,
    test,
    book,
    reason,
    entries,
    settings,
    default_architecture,
    default_context_mode,
    allow_global_writes,
    require_forget_confirmation,
    require_cross_character_confirmation,
    yes,
    no,
    previous,
    next,
    page_of,
    error,
    back,
    login,
    token,
    login_help,
    new_memory,
    id,
    scope,
    all_sessions,
    message_source,
    not_found,
    store_check,
    store_check_help,
    check_now,
    store_whole,
    store_damaged,
    file
);

/// English.
pub static EN: Words = Words {
    title: "AgentTavern",
    nav_overview: "Overview",
    nav_memories: "Memories",
    nav_variables: "Variables",
    nav_lore: "Lore tester",
    nav_settings: "Settings",
    switch_lang: "中文",
    sessions: "Sessions",
    session: "Session",
    character: "Character",
    chat: "Chat",
    architecture: "Architecture",
    context_mode: "Context mode",
    projection: "Projection",
    pending: "pending",
    pending_count: "sessions with a pending projection",
    no_sessions: "No session is bound yet. Start a roleplay in your host, or bind a session to a chat below.",
    mode_control: "Context mode",
    switch_to: "Switch to",
    unavailable_because: "Unavailable:",
    current_mode: "current",
    fork: "Fork",
    fork_help: "Copy this chat into a new session of either architecture. The original is untouched.",
    new_session: "New session id",
    new_chat: "New chat name",
    replay: "Replay",
    replay_help: "Read the host's log again and write what the chat is missing. Nothing is written twice.",
    replayed: "Replayed.",
    prompt: "Tavern-mode prompt",
    prompt_help: "The system prompt of this session. {{char}} and {{user}} stay as written. Empty resets to the default.",
    save: "Save",
    reset: "Reset to default",
    saved: "Saved.",
    bind: "Bind",
    bind_help: "Continue an existing chat (for example one imported from SillyTavern) in a session.",
    memories: "Memories",
    search: "Search",
    filter_scope: "Scope",
    any_scope: "any",
    include_forgotten: "include forgotten",
    no_memories: "No memory matches.",
    content: "Content",
    tags: "Tags",
    importance: "Importance",
    confidence: "Confidence",
    kind: "Kind",
    state: "State",
    source: "Written by",
    updated: "Updated",
    revision: "Revision",
    edit: "Edit",
    forget: "Forget",
    restore: "Restore",
    forgotten_note: "This memory is forgotten: the model no longer sees it. Restore brings it back as it was.",
    history: "History",
    action: "Action",
    at: "When",
    change: "Change",
    first_text: "First text",
    text_not_kept: "Text no longer kept (a memory keeps its last 8 texts)",
    text_unchanged: "Text unchanged",
    bring_back: "Bring this text back",
    changes: "Changes",
    no_changes: "No changes made here through the panel or the API yet.",
    turn: "Turn",
    messages_shown: "Messages",
    older: "← Older",
    newer: "Newer →",
    cut: "cut here; the whole message is in the chat file",
    conflict_title: "Someone changed this since you opened it",
    conflict_help: "Nothing was lost: your edit was not saved, and the current version is below. Apply your edit on top of it, or leave it.",
    yours: "Your edit",
    current: "Current version",
    apply_on_current: "Apply my edit on the current version",
    variables: "Variables",
    name: "Name",
    value: "Value",
    value_help: "A JSON value: 12, \"text\", true, [1, 2], {\"hp\": 10}.",
    delete: "Delete",
    set: "Set",
    no_variables: "No variable in this scope.",
    lore_tester: "Lore tester",
    lore_help: "Which lore entries does a text activate, why, and from which book? The same search the model runs.",
    test: "Test",
    book: "Book",
    reason: "Why",
    entries: "entries",
    settings: "Settings",
    default_architecture: "Architecture of new sessions",
    default_context_mode: "Context mode of new sessions",
    allow_global_writes: "The model may write global memories",
    require_forget_confirmation: "Forgetting needs the user's confirmation",
    require_cross_character_confirmation: "Writes other characters see need confirmation",
    yes: "yes",
    no: "no",
    previous: "Previous",
    next: "Next",
    page_of: "of",
    error: "Error",
    back: "Back",
    login: "Sign in",
    token: "Token",
    login_help: "This panel is served on a network address: enter the token the server was started with.",
    new_memory: "New memory",
    id: "Id",
    scope: "Scope",
    all_sessions: "all",
    message_source: "about chat message",
    not_found: "Not found.",
    store_check: "Store check",
    store_check_help: "Reads every log line, revision chain, chat and document of the store without changing anything.",
    check_now: "Check now",
    store_whole: "The store is whole: nothing is corrupt or set aside.",
    store_damaged: "The store has damage; what was set aside is kept, nothing is deleted.",
    file: "File",
};

/// 简体中文.
pub static ZH: Words = Words {
    title: "AgentTavern 酒馆",
    nav_overview: "总览",
    nav_memories: "记忆",
    nav_variables: "变量",
    nav_lore: "世界书测试",
    nav_settings: "设置",
    switch_lang: "English",
    sessions: "会话",
    session: "会话",
    character: "角色",
    chat: "聊天",
    architecture: "架构",
    context_mode: "上下文模式",
    projection: "投影",
    pending: "待补",
    pending_count: "个会话的投影待补",
    no_sessions: "还没有绑定的会话。在宿主里开始一段角色扮演，或在下方把会话绑定到已有聊天。",
    mode_control: "上下文模式",
    switch_to: "切换到",
    unavailable_because: "不可用：",
    current_mode: "当前",
    fork: "分叉",
    fork_help: "把这段聊天复制到任一架构的新会话。原聊天不变。",
    new_session: "新会话 id",
    new_chat: "新聊天名",
    replay: "重放",
    replay_help: "重新读取宿主日志，补写聊天缺少的部分。不会重复写入。",
    replayed: "已重放。",
    prompt: "酒馆模式提示词",
    prompt_help: "本会话的系统提示词。{{char}} 和 {{user}} 原样保留。清空即恢复默认。",
    save: "保存",
    reset: "恢复默认",
    saved: "已保存。",
    bind: "绑定",
    bind_help: "在会话中继续一段已有的聊天（例如从 SillyTavern 导入的）。",
    memories: "记忆",
    search: "搜索",
    filter_scope: "范围",
    any_scope: "全部",
    include_forgotten: "包括已遗忘",
    no_memories: "没有匹配的记忆。",
    content: "内容",
    tags: "标签",
    importance: "重要度",
    confidence: "可信度",
    kind: "类型",
    state: "状态",
    source: "写入者",
    updated: "更新于",
    revision: "修订号",
    edit: "编辑",
    forget: "遗忘",
    restore: "恢复",
    forgotten_note: "这条记忆已被遗忘：模型看不到它。恢复会让它原样回来。",
    history: "历史",
    action: "操作",
    at: "时间",
    change: "改动",
    first_text: "最初的文字",
    text_not_kept: "这一版的文字已不再保留（每条记忆保留最近 8 版文字）",
    text_unchanged: "文字未变",
    bring_back: "恢复成这一版的文字",
    changes: "改动记录",
    no_changes: "还没有人通过面板或 API 在这里做过改动。",
    turn: "回合",
    messages_shown: "消息",
    older: "← 更早",
    newer: "更新 →",
    cut: "此处截断；完整消息在聊天文件里",
    conflict_title: "你打开之后，有人改过它",
    conflict_help:
        "什么都没丢：你的修改没有保存，当前版本在下面。可以把你的修改应用到当前版本上，或者放弃。",
    yours: "你的修改",
    current: "当前版本",
    apply_on_current: "把我的修改应用到当前版本",
    variables: "变量",
    name: "名称",
    value: "值",
    value_help: "JSON 值：12、\"文字\"、true、[1, 2]、{\"hp\": 10}。",
    delete: "删除",
    set: "设置",
    no_variables: "这个范围里没有变量。",
    lore_tester: "世界书测试",
    lore_help: "一段文字会激活哪些世界书条目？为什么？来自哪本书？与模型使用的搜索相同。",
    test: "测试",
    book: "世界书",
    reason: "原因",
    entries: "条",
    settings: "设置",
    default_architecture: "新会话的架构",
    default_context_mode: "新会话的上下文模式",
    allow_global_writes: "允许模型写入全局记忆",
    require_forget_confirmation: "遗忘需要用户确认",
    require_cross_character_confirmation: "其他角色可见的写入需要确认",
    yes: "是",
    no: "否",
    previous: "上一页",
    next: "下一页",
    page_of: "共",
    error: "错误",
    back: "返回",
    login: "登录",
    token: "令牌",
    login_help: "面板在网络地址上提供：请输入服务器启动时使用的令牌。",
    new_memory: "新建记忆",
    id: "Id",
    scope: "范围",
    all_sessions: "全部",
    message_source: "关于聊天消息",
    not_found: "未找到。",
    store_check: "存储检查",
    store_check_help: "逐行读取存储的每条日志、修订链、聊天和文档，不做任何修改。",
    check_now: "立即检查",
    store_whole: "存储完好：没有损坏或被隔离的数据。",
    store_damaged: "存储有损坏；被隔离的数据都保留着，没有删除任何东西。",
    file: "文件",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_words_in_both_languages() {
        let (en, zh) = (EN.entries(), ZH.entries());
        assert_eq!(en.len(), zh.len());
        for ((key, e), (_, z)) in en.iter().zip(&zh) {
            assert!(
                !e.trim().is_empty() && !z.trim().is_empty(),
                "{key} is empty"
            );
            // Names and ids may be the same; sentences must be translated.
            if e.len() > 12 {
                assert_ne!(e, z, "{key} is not translated");
            }
        }
    }

    #[test]
    fn the_language_follows_the_query_then_the_cookie_then_the_browser() {
        assert_eq!(Lang::choose(Some("zh"), Some("en"), None), Lang::Zh);
        assert_eq!(Lang::choose(None, Some("zh"), Some("en")), Lang::Zh);
        assert_eq!(
            Lang::choose(None, None, Some("zh-CN,zh;q=0.9,en;q=0.8")),
            Lang::Zh
        );
        assert_eq!(
            Lang::choose(None, None, Some("en-US,en;q=0.9,zh;q=0.5")),
            Lang::En
        );
        assert_eq!(Lang::choose(Some("fr"), None, None), Lang::En);
    }
}
