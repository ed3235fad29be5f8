//! Ends a transfer whose bytes stop coming. A read timeout is not enough: a
//! hostile or broken server that sends one byte every few seconds resets it
//! forever. Here a transfer must bring at least [`MIN_BYTES`] in every
//! window of the stall time (`--stall-timeout`, default 30 s), or it ends
//! with an error naming the stall; the registry client then retries or
//! resumes, a bounded number of times.

use std::time::Duration;

// tokio's clock, so tests can drive it (paused) without waiting.
use tokio::time::Instant;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, Stream, StreamExt};

/// The least a live transfer brings per stall window.
pub const MIN_BYTES: u64 = crate::primitives::progress::LIVE_BYTES;

/// The default stall window.
pub const DEFAULT: Duration = Duration::from_secs(30);

/// What a stalled transfer says: the window and what came in it.
pub fn describe(window: Duration, got: u64) -> String {
    format!(
        "stalled: {got} bytes in {}s (under {MIN_BYTES} bytes per {}s; raise --stall-timeout for a slow link)",
        window.as_secs_f64(),
        window.as_secs_f64()
    )
}

struct State<S> {
    /// Said while it waits ([`crate::primitives::progress::waiting`]).
    waiting: crate::primitives::progress::Waiting,
    body: Option<S>,
    window: Duration,
    start: Instant,
    got: u64,
}

/// `body`, ending with an error when fewer than [`MIN_BYTES`] arrive in
/// any `window`; other errors pass through as their text. `what` (the URL,
/// the tries left) is said while it brings nothing.
pub fn guard<S, E>(
    body: S,
    window: Duration,
    what: String,
) -> BoxStream<'static, Result<Bytes, String>>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::error::Error + 'static,
{
    let state = State {
        waiting: crate::primitives::progress::waiting(what),
        body: Some(body),
        window,
        start: Instant::now(),
        got: 0,
    };
    Box::pin(stream::unfold(state, |mut s| async move {
        loop {
            let body = s.body.as_mut()?;
            let left = s.window.saturating_sub(s.start.elapsed());
            let next = tokio::time::timeout(left, body.next()).await;
            let window_over = s.start.elapsed() >= s.window;
            match next {
                Ok(None) => return None,
                Ok(Some(Err(e))) => {
                    s.body = None;
                    return Some((Err(crate::primitives::text::error_chain(&e)), s));
                }
                Ok(Some(Ok(chunk))) => {
                    s.got += chunk.len() as u64;
                    s.waiting.got(chunk.len() as u64);
                    if window_over {
                        if s.got < MIN_BYTES {
                            s.body = None;
                            let why = describe(s.window, s.got);
                            return Some((Err(why), s));
                        }
                        s.start = Instant::now();
                        s.got = 0;
                    }
                    return Some((Ok(chunk), s));
                }
                Err(_) if s.got < MIN_BYTES => {
                    s.body = None;
                    let why = describe(s.window, s.got);
                    return Some((Err(why), s));
                }
                Err(_) => {
                    s.start = Instant::now();
                    s.got = 0;
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Never;
    impl std::fmt::Display for Never {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("never")
        }
    }
    impl std::error::Error for Never {}

    /// Driven by tokio's paused clock: no wall-clock waiting.
    #[tokio::test(start_paused = true)]
    async fn a_trickle_is_a_stall_and_a_steady_stream_is_not() {
        let window = Duration::from_secs(30);
        // One byte every 5 s: a trickle that resets any read timeout.
        let trickle = stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Some((Ok::<_, Never>(Bytes::from_static(b"x")), n + 1))
        });
        let mut g = guard(Box::pin(trickle), window, "t".into());
        let mut got = 0;
        let err = loop {
            match g.next().await {
                Some(Ok(c)) => got += c.len(),
                Some(Err(e)) => break e,
                None => panic!("ended without a stall"),
            }
        };
        assert!(err.starts_with("stalled: "), "{err}");
        assert!(got <= 7, "{got}");
        // Silence: no byte at all.
        let silent = stream::pending::<Result<Bytes, Never>>();
        let mut g = guard(Box::pin(silent), window, "s".into());
        assert!(g
            .next()
            .await
            .unwrap()
            .unwrap_err()
            .contains("0 bytes in 30s"));
        // 4 KiB every 10 s for two minutes: slow, alive, whole.
        let steady = stream::unfold(0u32, |n| async move {
            if n == 12 {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            Some((Ok::<_, Never>(Bytes::from(vec![0u8; 4096])), n + 1))
        });
        let all: Vec<_> = guard(Box::pin(steady), window, "s".into()).collect().await;
        assert_eq!(all.len(), 12);
        assert!(all.iter().all(Result::is_ok));
    }
}
