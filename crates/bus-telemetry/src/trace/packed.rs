//! Spans as the ring keeps them: one allocation each instead of a dozen. A [`Span`] holds six
//! strings and a B-tree of attribute strings (about 1.3 KiB for the bus's own shape); a
//! [`PackedSpan`] holds its times and one byte string, in which names, services and
//! attribute keys that recur are numbers into the ring's [`Interner`]. About a third of the
//! memory for the same span, so a smaller budget keeps as many traces for the console.

use super::Span;
use std::collections::{BTreeMap, HashMap};

/// The most distinct strings the interner holds; later ones are written out in each span.
const INTERNED_MAX: usize = 4096;
/// Longer strings are written out: a caller-chosen key must not fill the table.
const INTERNED_LEN_MAX: usize = 128;
/// The high bit of a string's header: the rest is an interned index, not a length.
const INTERNED_BIT: u32 = 1 << 31;

/// Recurring strings (span names, services, attribute keys), numbered in arrival order.
/// Bounded by [`INTERNED_MAX`] × [`INTERNED_LEN_MAX`].
#[derive(Default)]
pub(crate) struct Interner {
    strings: Vec<Box<str>>,
    index: HashMap<Box<str>, u32>,
}

impl Interner {
    fn lookup_or_add(&mut self, s: &str) -> Option<u32> {
        if let Some(&i) = self.index.get(s) {
            return Some(i);
        }
        if s.len() > INTERNED_LEN_MAX || self.strings.len() >= INTERNED_MAX {
            return None;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.into());
        self.index.insert(s.into(), i);
        Some(i)
    }

    fn get(&self, i: u32) -> &str {
        self.strings.get(i as usize).map_or("", |s| s)
    }
}

/// A kept span: its times, its error flag and its strings in one allocation.
pub(crate) struct PackedSpan {
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub error: bool,
    has_parent: bool,
    /// trace id, span id, parent span id (when there is one), name, service, then each
    /// attribute's key and value. Each string: a u32 (little-endian) header, either its
    /// length followed by its bytes, or [`INTERNED_BIT`] | an interner index.
    strings: Box<[u8]>,
}

/// A span's strings in [`PackedSpan::strings`] order.
fn put(out: &mut Vec<u8>, s: &str, interned: Option<&mut Interner>) {
    if let Some(i) = interned.and_then(|t| t.lookup_or_add(s)) {
        out.extend_from_slice(&(INTERNED_BIT | i).to_le_bytes());
    } else {
        // A span's strings are far below 2 GiB (the ring refuses spans over its budget).
        let len = s.len().min((INTERNED_BIT - 1) as usize);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&s.as_bytes()[..len]);
    }
}

impl PackedSpan {
    pub fn pack(span: &Span, interner: &mut Interner) -> Self {
        let mut out = Vec::with_capacity(
            96 + span.name.len()
                + span
                    .attributes
                    .iter()
                    .map(|(k, v)| 8 + k.len() + v.len())
                    .sum::<usize>(),
        );
        put(&mut out, &span.trace_id, None);
        put(&mut out, &span.span_id, None);
        if let Some(p) = &span.parent_span_id {
            put(&mut out, p, None);
        }
        put(&mut out, &span.name, Some(interner));
        put(&mut out, &span.service, Some(interner));
        for (k, v) in &span.attributes {
            put(&mut out, k, Some(interner));
            put(&mut out, v, None);
        }
        Self {
            start_unix_nanos: span.start_unix_nanos,
            end_unix_nanos: span.end_unix_nanos,
            error: span.error,
            has_parent: span.parent_span_id.is_some(),
            strings: out.into_boxed_slice(),
        }
    }

    /// Real bytes: the struct and its allocation, in the allocator's 16-byte size classes.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.strings.len().div_ceil(16) * 16
    }

    fn strings<'a>(&'a self, interner: &'a Interner) -> Strings<'a> {
        Strings {
            rest: &self.strings,
            interner,
        }
    }

    pub fn trace_id<'a>(&'a self, interner: &'a Interner) -> &'a str {
        self.strings(interner).next().unwrap_or("")
    }

    /// The attributes' keys and values, in key order.
    fn attributes<'a>(
        &'a self,
        interner: &'a Interner,
    ) -> impl Iterator<Item = (&'a str, &'a str)> {
        let mut it = self.strings(interner);
        // Past the ids, the name and the service.
        it.by_ref()
            .take(4 + usize::from(self.has_parent))
            .for_each(drop);
        std::iter::from_fn(move || Some((it.next()?, it.next()?)))
    }

    /// The value of one attribute, without unpacking the rest.
    pub fn attribute<'a>(&'a self, key: &str, interner: &'a Interner) -> Option<&'a str> {
        self.attributes(interner)
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    pub fn unpack(&self, interner: &Interner) -> Span {
        let mut it = self.strings(interner);
        let mut next = || it.next().unwrap_or("").to_string();
        let trace_id = next();
        let span_id = next();
        let parent_span_id = self.has_parent.then(&mut next);
        let name = next();
        let service = next();
        let attributes = self
            .attributes(interner)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>();
        Span {
            trace_id,
            span_id,
            parent_span_id,
            name,
            service,
            start_unix_nanos: self.start_unix_nanos,
            end_unix_nanos: self.end_unix_nanos,
            attributes,
            error: self.error,
        }
    }
}

/// The strings of a packed span, in order.
struct Strings<'a> {
    rest: &'a [u8],
    interner: &'a Interner,
}

impl<'a> Iterator for Strings<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        let (head, rest) = self.rest.split_first_chunk::<4>()?;
        let head = u32::from_le_bytes(*head);
        if head & INTERNED_BIT != 0 {
            self.rest = rest;
            return Some(self.interner.get(head & !INTERNED_BIT));
        }
        let len = (head as usize).min(rest.len());
        let (s, rest) = rest.split_at(len);
        self.rest = rest;
        // Written from a `str` whole (a cut at 2 GiB cannot happen under the ring's budget).
        Some(std::str::from_utf8(s).unwrap_or(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{ATTR_FUNCTION_ID, ATTR_SESSION_ID, TraceContext};

    #[test]
    fn a_span_comes_back_as_it_went_in() {
        let mut interner = Interner::default();
        let root = TraceContext::new_root().with_baggage(ATTR_SESSION_ID, "s-1");
        let mut parent = Span::start("turn::step", "turn-orchestrator", &root);
        parent.finish(false);
        let mut child = Span::start("demo::echo", "tools", &parent.context(&root.baggage));
        child
            .attributes
            .insert(ATTR_FUNCTION_ID.into(), "demo::echo".into());
        child.attributes.insert("".into(), "".into());
        child
            .attributes
            .insert("long.key".repeat(40), "é\u{0}x".into());
        child.finish(true);
        for span in [&parent, &child] {
            let packed = PackedSpan::pack(span, &mut interner);
            assert_eq!(&packed.unpack(&interner), span);
            assert_eq!(packed.trace_id(&interner), span.trace_id);
            assert_eq!(packed.attribute(ATTR_SESSION_ID, &interner), Some("s-1"));
            assert_eq!(packed.attribute("missing", &interner), None);
        }
        let packed = PackedSpan::pack(&child, &mut interner);
        assert_eq!(
            packed.attribute(&"long.key".repeat(40), &interner),
            Some("é\u{0}x"),
            "a key too long to intern is written out"
        );
        assert!(interner.strings.iter().all(|s| s.len() <= INTERNED_LEN_MAX));
    }

    #[test]
    fn the_interner_is_bounded_and_later_strings_are_written_out() {
        let mut interner = Interner::default();
        let root = TraceContext::new_root();
        for i in 0..INTERNED_MAX + 50 {
            let mut s = Span::start(&format!("name-{i}"), "svc", &root);
            s.attributes.insert(format!("key-{i}"), "v".into());
            let packed = PackedSpan::pack(&s, &mut interner);
            assert_eq!(packed.unpack(&interner), s);
        }
        assert_eq!(interner.strings.len(), INTERNED_MAX);
    }
}
