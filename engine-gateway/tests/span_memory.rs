//! The span ring's byte budget is real memory: `Span::approx_bytes` (the export queue's
//! budget) and the ring's own count of its packed spans are checked against what a counting
//! allocator hands out for spans shaped like the bus's own (ids, a name, a service and the
//! `iii.*` attributes), so a budget of N bytes keeps about N bytes of spans.

use engine_gateway::trace::{
    ATTR_FUNCTION_ID, ATTR_MESSAGE_ID, ATTR_SESSION_ID, Span, SpanStore, TraceContext,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn root() -> TraceContext {
    TraceContext::new_root()
        .with_baggage(ATTR_SESSION_ID, "bench-session-17")
        .with_baggage(ATTR_MESSAGE_ID, "m-92e25be7b87c7fbc")
}

/// A span of the bus's shape with `attrs` attributes (`iii.*` from the baggage and more).
fn span(i: usize, attrs: usize, root: &TraceContext) -> Span {
    let mut s = Span::start("turn::function_execute", "turn-orchestrator", root);
    if attrs == 0 {
        s.attributes.clear();
    } else {
        s.attributes
            .insert(ATTR_FUNCTION_ID.into(), "turn::x".into());
        for a in 0..attrs.saturating_sub(3) {
            s.attributes
                .insert(format!("extra.{a}"), format!("value {i}"));
        }
    }
    s.finish(false);
    s
}

// One test: the allocator's count is process-wide, so the two measures must not overlap.
#[test]
fn span_bytes_are_within_a_fifth_of_what_is_allocated() {
    approx_bytes_is_within_a_fifth_of_what_is_allocated();
    the_rings_count_is_within_a_fifth_of_what_it_holds();
}

fn approx_bytes_is_within_a_fifth_of_what_is_allocated() {
    let root = root();
    for attrs in [0usize, 3, 12] {
        let n = 5_000;
        let before = LIVE.load(Ordering::Relaxed);
        let mut spans: Vec<Span> = Vec::with_capacity(n);
        let mut estimated = 0usize;
        for i in 0..n {
            let s = span(i, attrs, &root);
            estimated += s.approx_bytes();
            spans.push(s);
        }
        // The vector's own slots are the struct part of each estimate.
        let allocated = (LIVE.load(Ordering::Relaxed) - before) as f64;
        let ratio = estimated as f64 / allocated;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{attrs} attributes: estimated {estimated} for {allocated} allocated ({ratio:.2})"
        );
        drop(spans);
    }
}

/// The ring keeps spans packed (one allocation each); what it counts is what it holds, and a
/// span of the bus's shape takes well under half of its unpacked size.
fn the_rings_count_is_within_a_fifth_of_what_it_holds() {
    let root = root();
    for attrs in [0usize, 3, 12] {
        // Within the ring's first allocation of slots (4 096), which it counts per span.
        let n = 4_000;
        let unpacked: usize = (0..n).map(|i| span(i, attrs, &root).approx_bytes()).sum();
        let before = LIVE.load(Ordering::Relaxed);
        let store = SpanStore::with_max_bytes(n, usize::MAX, None);
        for i in 0..n {
            // Made and dropped here: only what the ring keeps stays allocated.
            store.record(span(i, attrs, &root));
        }
        let allocated = (LIVE.load(Ordering::Relaxed) - before) as f64;
        let counted = store.kept_bytes();
        println!(
            "{attrs} attributes: {} bytes a span packed, {} unpacked",
            counted / n,
            unpacked / n
        );
        let ratio = counted as f64 / allocated;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{attrs} attributes: the ring counts {counted} for {allocated} allocated ({ratio:.2})"
        );
        if attrs > 0 {
            assert!(
                counted * 2 < unpacked,
                "{attrs} attributes: packed {counted}, unpacked {unpacked}"
            );
        }
        drop(store);
    }
}
