//! The span ring's byte budget is real memory: `Span::approx_bytes` is checked against what
//! a counting allocator hands out for spans shaped like the bus's own (ids, a name, a service
//! and the `iii.*` attributes), so a budget of N bytes keeps about N bytes of spans.

use engine_gateway::trace::{
    ATTR_FUNCTION_ID, ATTR_MESSAGE_ID, ATTR_SESSION_ID, Span, TraceContext,
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

#[test]
fn approx_bytes_is_within_a_fifth_of_what_is_allocated() {
    let root = TraceContext::new_root()
        .with_baggage(ATTR_SESSION_ID, "bench-session-17")
        .with_baggage(ATTR_MESSAGE_ID, "m-92e25be7b87c7fbc");
    for attrs in [0usize, 3, 12] {
        let n = 5_000;
        let before = LIVE.load(Ordering::Relaxed);
        let mut spans: Vec<Span> = Vec::with_capacity(n);
        let mut estimated = 0usize;
        for i in 0..n {
            let mut s = Span::start("turn::function_execute", "turn-orchestrator", &root);
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
