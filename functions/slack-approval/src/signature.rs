//! Slack request signing: `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{raw body}` under the
//! app's signing secret (https://api.slack.com/authentication/verifying-requests-from-slack).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Requests older (or newer) than this are refused, so a captured request cannot be
/// replayed later; within it, each signature is accepted once (see the replay guard).
pub const MAX_AGE_SECS: u64 = 300;

#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    MissingTimestamp,
    MissingSignature,
    Stale,
    BadSignature,
}

impl Rejected {
    pub fn message(&self) -> &'static str {
        match self {
            Rejected::MissingTimestamp => "missing or unreadable X-Slack-Request-Timestamp",
            Rejected::MissingSignature => "missing or malformed X-Slack-Signature",
            Rejected::Stale => "the request is older than 5 minutes",
            Rejected::BadSignature => "the signature does not match",
        }
    }
}

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// The `X-Slack-Signature` value for a request (what Slack sends; tests sign with it).
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    format!(
        "v0={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// The signature's bytes as lower-case hex: one key per signature, however its hex is
/// written. `None` for a header that is not `v0=<hex>`.
pub fn replay_key(signature: &str) -> Option<String> {
    let hex_sig = signature.trim().strip_prefix("v0=")?;
    let bytes = hex::decode(hex_sig).ok()?;
    Some(hex::encode(bytes))
}

/// Check a request's timestamp and signature (constant-time comparison).
pub fn verify(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: u64,
) -> Result<(), Rejected> {
    let ts_text = timestamp.ok_or(Rejected::MissingTimestamp)?;
    let ts: u64 = ts_text
        .trim()
        .parse()
        .map_err(|_| Rejected::MissingTimestamp)?;
    if now_secs.abs_diff(ts) > MAX_AGE_SECS {
        return Err(Rejected::Stale);
    }
    let hex_sig = signature
        .and_then(|s| s.trim().strip_prefix("v0="))
        .ok_or(Rejected::MissingSignature)?;
    let given = hex::decode(hex_sig).map_err(|_| Rejected::MissingSignature)?;
    mac(secret, ts_text.trim(), body)
        .verify_slice(&given)
        .map_err(|_| Rejected::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_documented_example_verifies() {
        // The worked example of Slack's documentation.
        let secret = "8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let ts = "1531420618";
        assert_eq!(
            sign(secret, ts, body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
        assert_eq!(
            verify(
                secret,
                Some(ts),
                Some(&sign(secret, ts, body)),
                body,
                1_531_420_618 + 10
            ),
            Ok(())
        );
    }

    #[test]
    fn forged_stale_and_malformed_requests_are_rejected() {
        let body = b"command=%2Fapprove&text=s1%2Fc1";
        let now = 1_800_000_000;
        let ts = now.to_string();
        let good = sign("secret", &ts, body);
        assert_eq!(
            verify("other", Some(&ts), Some(&good), body, now),
            Err(Rejected::BadSignature)
        );
        assert_eq!(
            verify(
                "secret",
                Some(&ts),
                Some(&good),
                b"command=%2Fapprove&text=s1%2Fc2",
                now
            ),
            Err(Rejected::BadSignature)
        );
        assert_eq!(
            verify("secret", Some(&ts), Some(&good), body, now + 301),
            Err(Rejected::Stale)
        );
        assert_eq!(
            verify("secret", Some(&ts), Some(&good), body, now - 301),
            Err(Rejected::Stale)
        );
        assert_eq!(
            verify("secret", None, Some(&good), body, now),
            Err(Rejected::MissingTimestamp)
        );
        assert_eq!(
            verify("secret", Some("soon"), Some(&good), body, now),
            Err(Rejected::MissingTimestamp)
        );
        assert_eq!(
            verify("secret", Some(&ts), Some("sha256=abc"), body, now),
            Err(Rejected::MissingSignature)
        );
        assert_eq!(
            verify("secret", Some(&ts), Some("v0=zz"), body, now),
            Err(Rejected::MissingSignature)
        );
        assert_eq!(
            verify("secret", Some(&ts), Some(&good[..21]), body, now),
            Err(Rejected::BadSignature)
        );
    }
}
