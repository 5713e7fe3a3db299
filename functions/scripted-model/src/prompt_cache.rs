//! The upstreams' prompt caches, as their documentation describes them, so a scripted session
//! reports the usage a real one would and the harness's markers can be judged by what they
//! save.
//!
//! - **Markers** ([`check_markers`], on every request): Anthropic takes at most four blocks
//!   with `cache_control`, Bedrock at most four `cachePoint` blocks and only for the model
//!   families that cache (Claude, Nova); anything else is refused as the real API refuses it.
//! - **Billing** (a cassette with `simulate_cache`, for turns that script no usage): a request
//!   is a sequence of blocks in the order the cache sees them (tools, system, messages), each
//!   about a token per four bytes. A marked block's prefix is written to the cache (when it
//!   holds at least [`MIN_CACHED_TOKENS`]); a later request reads the longest cached prefix
//!   found at a marker or up to [`LOOKBACK`] blocks before one. Reads, writes and the rest of
//!   the input come back as the usage. OpenAI's cache needs no marker: every block boundary
//!   counts, and writing is free (reported as plain input).

use serde_json::Value;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

/// Anthropic's and Bedrock's limit of cache breakpoints per request.
pub const MAX_MARKERS: usize = 4;
/// A prefix shorter than this is not cached (Anthropic's minimum for its Sonnet and Opus
/// models, Bedrock's for Claude).
pub const MIN_CACHED_TOKENS: u64 = 1024;
/// How many blocks before a breakpoint the cache looks for an earlier entry.
pub const LOOKBACK: usize = 20;
/// Prefixes remembered; the oldest is forgotten first (the server runs for hours in a bench).
pub const ENTRIES_KEPT: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Anthropic,
    Bedrock,
    OpenAi,
}

impl Dialect {
    pub fn of(path: &str) -> Self {
        if path.contains("converse") {
            Self::Bedrock
        } else if path.contains("/messages") {
            Self::Anthropic
        } else {
            Self::OpenAi
        }
    }
}

/// Occurrences of `"key":` as an object key in a JSON body (inside a string the quotes would
/// be escaped): counted on the bytes, as the server reads bodies without a tree.
fn key_count(body: &[u8], key: &str) -> usize {
    let needle = format!("\"{key}\":");
    let n = needle.as_bytes();
    body.windows(n.len())
        .enumerate()
        .filter(|(i, w)| *w == n && (*i == 0 || body[i - 1] != b'\\'))
        .count()
}

/// Bedrock's families that take cache points.
pub fn bedrock_caches(model: &str) -> bool {
    model.contains("anthropic.claude") || model.contains("amazon.nova")
}

/// The refusal a real API gives for this request's cache markers, if any.
pub fn check_markers(dialect: Dialect, model: &str, body: &[u8]) -> Option<String> {
    match dialect {
        Dialect::Anthropic => {
            let n = key_count(body, "cache_control");
            (n > MAX_MARKERS).then(|| {
                format!(
                    "A maximum of {MAX_MARKERS} blocks with cache_control may be provided. Found {n}."
                )
            })
        }
        Dialect::Bedrock => {
            let n = key_count(body, "cachePoint");
            if n > 0 && !bedrock_caches(model) {
                Some(format!(
                    "The model {model} does not support prompt caching: remove the cachePoint blocks"
                ))
            } else if n > MAX_MARKERS {
                Some(format!(
                    "The number of cache points ({n}) exceeds the maximum of {MAX_MARKERS}"
                ))
            } else {
                None
            }
        }
        Dialect::OpenAi => None,
    }
}

/// One block of a request as the cache sees it.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    /// The prefix through this block (a rolling hash of every block so far).
    prefix: u64,
    /// Tokens of the prefix through this block.
    tokens: u64,
    marked: bool,
}

fn tokens_of(v: &Value) -> u64 {
    (v.to_string().len() as u64).div_ceil(4)
}

struct Blocks {
    out: Vec<Block>,
    hash: u64,
    tokens: u64,
}

impl Blocks {
    fn new() -> Self {
        Self {
            out: Vec::new(),
            hash: 0,
            tokens: 0,
        }
    }

    /// A block: its content without its marker, in its section and role.
    fn push(&mut self, section: &str, content: &Value, marked: bool) {
        let mut h = DefaultHasher::new();
        self.hash.hash(&mut h);
        section.hash(&mut h);
        content.to_string().hash(&mut h);
        self.hash = h.finish();
        self.tokens += tokens_of(content);
        self.out.push(Block {
            prefix: self.hash,
            tokens: self.tokens,
            marked,
        });
    }

    /// Anthropic: a block with its `cache_control` taken off.
    fn push_marked_field(&mut self, section: &str, block: &Value) {
        let mut b = block.clone();
        let marked = b
            .as_object_mut()
            .and_then(|o| o.remove("cache_control"))
            .is_some();
        self.push(section, &b, marked);
    }

    /// Bedrock: a `{cachePoint}` entry marks the block before it.
    fn push_list_with_points(&mut self, section: &str, list: &Value) {
        for b in list.as_array().into_iter().flatten() {
            if b.get("cachePoint").is_some() {
                if let Some(last) = self.out.last_mut() {
                    last.marked = true;
                }
            } else {
                self.push(section, b, false);
            }
        }
    }
}

fn blocks(dialect: Dialect, body: &Value) -> Vec<Block> {
    let mut b = Blocks::new();
    match dialect {
        Dialect::Anthropic => {
            for t in body["tools"].as_array().into_iter().flatten() {
                b.push_marked_field("tools", t);
            }
            match &body["system"] {
                Value::Array(a) => a.iter().for_each(|s| b.push_marked_field("system", s)),
                Value::Null => {}
                s => b.push("system", s, false),
            }
            for m in body["messages"].as_array().into_iter().flatten() {
                let role = m["role"].as_str().unwrap_or("");
                match &m["content"] {
                    Value::Array(a) => a.iter().for_each(|c| b.push_marked_field(role, c)),
                    c => b.push(role, c, false),
                }
            }
        }
        Dialect::Bedrock => {
            b.push_list_with_points("tools", &body["toolConfig"]["tools"]);
            b.push_list_with_points("system", &body["system"]);
            for m in body["messages"].as_array().into_iter().flatten() {
                let role = m["role"].as_str().unwrap_or("");
                b.push_list_with_points(role, &m["content"]);
            }
        }
        Dialect::OpenAi => {
            for t in body["tools"].as_array().into_iter().flatten() {
                b.push("tools", t, true);
            }
            for m in body["messages"].as_array().into_iter().flatten() {
                b.push("message", m, true);
            }
        }
    }
    b.out
}

/// Input, cache reads and cache writes of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Billed {
    pub input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// The cached prefixes, bounded.
#[derive(Default)]
pub struct PromptCache {
    seen: HashSet<u64>,
    order: VecDeque<u64>,
}

impl PromptCache {
    fn remember(&mut self, prefix: u64) {
        if self.seen.insert(prefix) {
            self.order.push_back(prefix);
            while self.order.len() > ENTRIES_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.seen.remove(&old);
                }
            }
        }
    }

    /// What `body` costs against this cache, which it then updates.
    pub fn bill(&mut self, dialect: Dialect, body: &Value) -> Billed {
        let blocks = blocks(dialect, body);
        let total = blocks.last().map_or(0, |b| b.tokens);
        let marks: Vec<usize> = (0..blocks.len()).filter(|&i| blocks[i].marked).collect();
        let mut read = 0;
        for &m in &marks {
            let from = m.saturating_sub(LOOKBACK - 1);
            if let Some(j) = (from..=m)
                .rev()
                .find(|&j| self.seen.contains(&blocks[j].prefix))
            {
                read = read.max(blocks[j].tokens);
            }
        }
        let mut written = read;
        for &m in &marks {
            if blocks[m].tokens >= MIN_CACHED_TOKENS {
                self.remember(blocks[m].prefix);
                written = written.max(blocks[m].tokens);
            }
        }
        let write = written - read;
        match dialect {
            // OpenAI bills no write: what was written is plain input.
            Dialect::OpenAi => Billed {
                input: total - read,
                cache_read: read,
                cache_write: 0,
            },
            _ => Billed {
                input: total - read - write,
                cache_read: read,
                cache_write: write,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn anthropic(messages: usize, marked: bool) -> Value {
        let big = "x".repeat(8000); // about 2000 tokens
        let mark = |v: Value| {
            let mut v = v;
            if marked {
                v["cache_control"] = json!({"type": "ephemeral"});
            }
            v
        };
        let mut ms = Vec::new();
        for i in 0..messages {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let mut block =
                json!({"type": "text", "text": format!("message {i} {}", "y".repeat(400))});
            if i + 1 == messages {
                block = mark(block);
            }
            ms.push(json!({"role": role, "content": [block]}));
        }
        json!({
            "tools": [mark(json!({"name": "t", "description": "d", "input_schema": {}}))],
            "system": [mark(json!({"type": "text", "text": big}))],
            "messages": ms,
        })
    }

    #[test]
    fn a_growing_conversation_reads_what_the_last_request_wrote() {
        let mut c = PromptCache::default();
        let first = c.bill(Dialect::Anthropic, &anthropic(1, true));
        assert_eq!(first.cache_read, 0);
        assert!(first.cache_write > 2000, "{first:?}");
        let second = c.bill(Dialect::Anthropic, &anthropic(3, true));
        // The whole first request (through its last message) is read back.
        assert_eq!(second.cache_read, first.cache_write + first.input);
        assert!(second.cache_write > 0 && second.input < 10, "{second:?}");
        // The same conversation without markers: nothing read or written.
        let mut plain = PromptCache::default();
        for n in [1, 3, 5] {
            let b = plain.bill(Dialect::Anthropic, &anthropic(n, false));
            assert_eq!((b.cache_read, b.cache_write), (0, 0));
        }
    }

    #[test]
    fn a_short_prefix_is_not_cached() {
        let mut c = PromptCache::default();
        let body = json!({"system": [{"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}], "messages": []});
        assert_eq!(c.bill(Dialect::Anthropic, &body).cache_write, 0);
        assert_eq!(c.bill(Dialect::Anthropic, &body).cache_read, 0);
    }

    #[test]
    fn bedrock_cache_points_mark_the_block_before_them() {
        let big = "z".repeat(8000);
        let body = |n: usize| {
            let mut content = vec![json!({"text": "hi"})];
            for i in 0..n {
                content.push(json!({"text": format!("more {i}")}));
            }
            content.push(json!({"cachePoint": {"type": "default"}}));
            json!({"system": [{"text": big}, {"cachePoint": {"type": "default"}}],
                   "messages": [{"role": "user", "content": content}]})
        };
        let mut c = PromptCache::default();
        let a = c.bill(Dialect::Bedrock, &body(0));
        let b = c.bill(Dialect::Bedrock, &body(2));
        assert_eq!(a.cache_read, 0);
        assert_eq!(b.cache_read, a.cache_write, "{a:?} {b:?}");
    }

    #[test]
    fn markers_over_the_limit_or_for_a_model_without_a_cache_are_refused() {
        let five = br#"{"a":{"cache_control":1},"b":{"cache_control":1},"c":{"cache_control":1},"d":{"cache_control":1},"e":{"cache_control":1}}"#;
        assert!(
            check_markers(Dialect::Anthropic, "m", five)
                .unwrap()
                .contains("Found 5")
        );
        let four = br#"{"a":{"cache_control":1},"b":{"cache_control":1},"c":{"cache_control":1},"d":{"cache_control":1},"t":"\"cache_control\":"}"#;
        assert_eq!(check_markers(Dialect::Anthropic, "m", four), None);
        let one = br#"{"system":[{"cachePoint":{"type":"default"}}]}"#;
        assert!(check_markers(Dialect::Bedrock, "meta.llama3", one).is_some());
        assert_eq!(
            check_markers(Dialect::Bedrock, "amazon.nova-pro-v1:0", one),
            None
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut c = PromptCache::default();
        for i in 0..(ENTRIES_KEPT + 10) {
            c.remember(i as u64);
        }
        assert_eq!(c.seen.len(), ENTRIES_KEPT);
        assert!(!c.seen.contains(&0));
    }
}
