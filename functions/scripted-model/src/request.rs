//! What the server reads of a request body: the fields it answers by, and of each message its
//! role and text. Read straight from the bytes into these types, not into a JSON tree: each
//! request carries the whole conversation, and building a tree of it on every request made
//! this zero-latency model cost time that grew with the conversation (the benches measure
//! the harness around it). Any shape is accepted; what is not the expected type reads as
//! absent, as it did when the body was indexed as JSON.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Request {
    #[serde(default)]
    pub model: Value,
    #[serde(default)]
    pub stream: Value,
    #[serde(default)]
    pub stream_options: Value,
    /// Anthropic's system prompt (a string or text blocks).
    #[serde(default)]
    system: Content,
    #[serde(default)]
    messages: Messages,
}

#[derive(Debug, Default)]
struct Messages(Vec<Message>);

#[derive(Debug, Default)]
struct Message {
    role: Value,
    content: Content,
}

/// Roles whose content nothing reads: their text is never matched, and their tool results
/// are counted by role (`tool`) or come in user messages (Anthropic).
fn content_unread(role: &Value) -> bool {
    role == "tool" || role == "assistant"
}

/// A message's content: a string, or blocks of which the type and text are kept.
#[derive(Debug, Default)]
enum Content {
    #[default]
    None,
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Default, Deserialize)]
struct Block {
    #[serde(default, rename = "type")]
    kind: Value,
    #[serde(default)]
    text: Value,
    /// Bedrock Converse's tool result (`{"toolResult": {...}}`, no `type`).
    #[serde(default, rename = "toolResult")]
    tool_result: Option<IgnoredAny>,
}

impl Content {
    fn text(&self) -> Vec<&str> {
        match self {
            Content::None => Vec::new(),
            Content::Text(s) => vec![s.as_str()],
            Content::Blocks(b) => b.iter().filter_map(|b| b.text.as_str()).collect(),
        }
    }
}

impl Request {
    /// Any JSON value reads (as absent where it is not the expected shape); an error only for
    /// what is not JSON.
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        match serde_json::from_slice::<Request>(body) {
            Ok(r) => Ok(r),
            // Valid JSON that is not an object (or holds a field of an unexpected shape that
            // fails the typed read): read as absent, as indexing it did.
            Err(e) if e.is_data() => Ok(Request::default()),
            Err(e) => Err(e),
        }
    }

    fn messages(&self) -> &[Message] {
        &self.messages.0
    }

    /// Tool results (Anthropic `tool_result` blocks, OpenAI `tool` messages, Bedrock
    /// `toolResult` blocks).
    pub fn tool_results(&self) -> usize {
        self.messages()
            .iter()
            .map(|m| match &m.content {
                _ if m.role == "tool" => 1,
                Content::Blocks(b) => b
                    .iter()
                    .filter(|b| b.kind == "tool_result" || b.tool_result.is_some())
                    .count(),
                _ => 0,
            })
            .sum()
    }

    /// The system prompt (Anthropic `system`; OpenAI system or developer messages).
    pub fn system_text(&self) -> String {
        if !matches!(self.system, Content::None) {
            return self.system.text().join("\n");
        }
        self.messages()
            .iter()
            .filter(|m| m.role == "system" || m.role == "developer")
            .map(|m| m.content.text().join("\n"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The text of the user messages, joined.
    pub fn user_text(&self) -> String {
        self.messages()
            .iter()
            .filter(|m| m.role == "user")
            .flat_map(|m| m.content.text())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Tool results in a request body (Anthropic `tool_result` blocks, OpenAI `tool` messages).
pub fn tool_results(body: &Value) -> usize {
    of_value(body).tool_results()
}

/// The system prompt of a request (Anthropic `system` string or blocks; OpenAI system message).
pub fn system_text(body: &Value) -> String {
    of_value(body).system_text()
}

/// The text of a request's user messages (Anthropic blocks or OpenAI strings), joined.
pub fn user_text(body: &Value) -> String {
    of_value(body).user_text()
}

fn of_value(body: &Value) -> Request {
    serde_json::to_vec(body)
        .ok()
        .and_then(|b| Request::parse(&b).ok())
        .unwrap_or_default()
}

/// `when: "system~=<text>"`: the request's system prompt contains `<text>`.
pub const SYSTEM_CONDITION: &str = "system~=";

/// `results<N`, `results>=N`, `user~=<text>` (a user message contains it), and several of
/// them joined by `&&`, all of which must hold.
pub(crate) fn condition_holds(when: &str, body: &Request, results: usize) -> bool {
    when.split("&&").all(|part| {
        let part = part.trim();
        match part.strip_prefix("user~=") {
            Some(needle) => body.user_text().contains(needle),
            None => count_holds(part, results),
        }
    })
}

fn count_holds(when: &str, results: usize) -> bool {
    let w = when.replace(' ', "");
    if let Some(n) = w
        .strip_prefix("results>=")
        .and_then(|n| n.parse::<usize>().ok())
    {
        return results >= n;
    }
    if let Some(n) = w
        .strip_prefix("results<")
        .and_then(|n| n.parse::<usize>().ok())
    {
        return results < n;
    }
    false
}

/// Visitor methods that read booleans, numbers and null as `$absent`.
macro_rules! absent_numbers {
    ($t:ty) => {
        absent_numbers!($t, <$t>::default());
    };
    ($t:ty, $absent:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<$t, E> {
            Ok($absent)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$t, E> {
            Ok($absent)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$t, E> {
            Ok($absent)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$t, E> {
            Ok($absent)
        }
        fn visit_unit<E>(self) -> Result<$t, E> {
            Ok($absent)
        }
    };
}

/// [`absent_numbers`] and strings too: every scalar reads as `$absent`.
macro_rules! absent_scalars {
    ($t:ty) => {
        absent_scalars!($t, <$t>::default());
    };
    ($t:ty, $absent:expr) => {
        absent_numbers!($t, $absent);
        fn visit_str<E>(self, _: &str) -> Result<$t, E> {
            Ok($absent)
        }
    };
}

/// The elements of a list, each one that is not an object read as `T::default()`.
fn lenient_list<'de, T, A>(mut seq: A) -> Result<Vec<T>, A::Error>
where
    T: Deserialize<'de> + Default,
    A: SeqAccess<'de>,
{
    let mut out = Vec::new();
    while let Some(item) = seq.next_element::<Lenient<T>>()? {
        out.push(item.0.unwrap_or_default());
    }
    Ok(out)
}

/// Read past an object.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

// Lenient readers: a list that is not a list, or content that is neither a string nor a list,
// reads as absent instead of failing the whole request.

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Messages, A::Error> {
                lenient_list(seq).map(Messages)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Messages, A::Error> {
                skip_map(map).map(|()| Messages::default())
            }
            absent_scalars!(Messages);
        }
        d.deserialize_any(V)
    }
}

enum MessageField {
    Role,
    Content,
    Other,
}

/// A key read without copying it.
impl<'de> Deserialize<'de> for MessageField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = MessageField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<MessageField, E> {
                Ok(match key {
                    "role" => MessageField::Role,
                    "content" => MessageField::Content,
                    _ => MessageField::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// A message's fields by name (others skipped), its content skipped unread when the role
/// before it says nothing reads it: most of a long conversation is tool calls and results.
impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut message = Message::default();
                while let Some(key) = map.next_key::<MessageField>()? {
                    match key {
                        MessageField::Role => message.role = map.next_value()?,
                        MessageField::Content if content_unread(&message.role) => {
                            map.next_value::<IgnoredAny>()?;
                            message.content = Content::None;
                        }
                        MessageField::Content => message.content = map.next_value()?,
                        MessageField::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(message)
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of blocks")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
                lenient_list(seq).map(Content::Blocks)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
                skip_map(map).map(|()| Content::None)
            }
            absent_numbers!(Content);
        }
        d.deserialize_any(V)
    }
}

/// A list element that is an object reads as `T`; anything else as `None`.
struct Lenient<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Lenient<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|t| Lenient(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Lenient<T>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            absent_scalars!(Lenient<T>, Lenient(None));
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}
