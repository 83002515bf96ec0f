//! W3C trace context in a task's metadata: the `traceparent` and
//! `tracestate` keys at the top level of the metadata object, with the
//! values of the HTTP headers of the same names
//! (<https://www.w3.org/TR/trace-context/>). A cairnq Python or TypeScript
//! client that puts its own span there (OpenTelemetry's W3C propagator
//! writes exactly these keys into a dict) links its submit to the run.

use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use serde_json::Value as Json;

/// The metadata key of the trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// The metadata key of the vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// The span context a task's metadata names, if it names a valid one.
pub fn extract(metadata: &Json) -> Option<SpanContext> {
    let parent = metadata.get(TRACEPARENT)?.as_str()?;
    let state = metadata
        .get(TRACESTATE)
        .and_then(Json::as_str)
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    parse_traceparent(parent, state)
}

/// Writes `cx` into the metadata object (a valid context only; anything
/// else in the object is kept). Metadata that is not an object (a string,
/// a number, an array, null: any JSON value is a task's metadata) is left
/// as written, without the context: a task's metadata is its submitter's.
pub fn inject(cx: &SpanContext, metadata: &mut Json) {
    let Some(object) = metadata.as_object_mut().filter(|_| cx.is_valid()) else { return };
    object.insert(TRACEPARENT.to_owned(), Json::String(format_traceparent(cx)));
    let state = cx.trace_state().header();
    if state.is_empty() {
        object.remove(TRACESTATE);
    } else {
        object.insert(TRACESTATE.to_owned(), Json::String(state));
    }
}

/// `00-<trace id>-<span id>-<flags>`, as version 00 defines it.
pub fn format_traceparent(cx: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", cx.trace_id(), cx.span_id(), cx.trace_flags().to_u8())
}

/// Reads a `traceparent` value. Version 00 must have exactly four fields;
/// a later version may add fields after the flags, which are ignored (as
/// the specification asks). Ids of all zeros, upper-case hex and version
/// `ff` are refused.
pub fn parse_traceparent(value: &str, state: TraceState) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
        return None;
    }
    if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let cx = SpanContext::new(trace_id, span_id, TraceFlags::new(flags & 1), true, state);
    cx.is_valid().then_some(cx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_writes_back_the_same() {
        let cx = parse_traceparent(SAMPLE, TraceState::default()).expect("valid");
        assert_eq!(cx.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert!(cx.is_sampled() && cx.is_remote());
        assert_eq!(format_traceparent(&cx), SAMPLE);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse_traceparent(bad, TraceState::default()).is_none(), "{bad:?} was read");
        }
        // A later version may append fields.
        assert!(parse_traceparent(&format!("01{}-more", &SAMPLE[2..]), TraceState::default()).is_some());
    }

    #[test]
    fn metadata_carries_the_context_and_keeps_its_other_keys() {
        let cx =
            parse_traceparent(SAMPLE, TraceState::from_str("vendor=value").expect("state")).expect("valid");
        let mut metadata = json!({"tenant": "acme"});
        inject(&cx, &mut metadata);
        assert_eq!(metadata["tenant"], "acme");
        assert_eq!(metadata[TRACEPARENT], SAMPLE);
        assert_eq!(metadata[TRACESTATE], "vendor=value");
        let back = extract(&metadata).expect("extracted");
        assert_eq!((back.trace_id(), back.span_id()), (cx.trace_id(), cx.span_id()));
        assert_eq!(back.trace_state().get("vendor"), Some("value"));
        // Not a string, or not there: no context.
        assert!(extract(&json!({TRACEPARENT: 7})).is_none());
        assert!(extract(&json!({})).is_none());
    }

    #[test]
    fn metadata_that_is_not_an_object_is_left_as_written() {
        let cx = parse_traceparent(SAMPLE, TraceState::default()).expect("valid");
        for written in [json!("42"), json!(null), json!([SAMPLE]), json!(7), json!(true)] {
            let mut metadata = written.clone();
            inject(&cx, &mut metadata);
            assert_eq!(metadata, written);
            assert!(extract(&metadata).is_none(), "{metadata}");
        }
    }
}
