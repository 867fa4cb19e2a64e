//! The supervisor with real tokio tasks and short real-time pauses.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

/// A shared log of what the services did.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// Resolves once `n` events say a service started (within 5 s).
    async fn started(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let count = self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.ends_with(" started"))
                .count();
            if count >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} services never started"
            );
            tokio::task::yield_now().await;
        }
    }
}

/// A service that starts, waits for its stop and takes `stop_takes` to
/// stop, logging both.
fn polite(
    events: &Events,
    name: &'static str,
    stop_takes: Duration,
) -> impl FnMut(CancellationToken) -> ServiceFuture + Send + 'static {
    let events = events.clone();
    move |token: CancellationToken| {
        let events = events.clone();
        Box::pin(async move {
            events.push(format!("{name} started"));
            token.cancelled().await;
            tokio::time::sleep(stop_takes).await;
            events.push(format!("{name} stopped"));
            Ok(())
        })
    }
}

const QUICK: Backoff = Backoff {
    first: Duration::from_millis(20),
    max: Duration::from_millis(80),
};

#[test]
fn the_backoff_doubles_up_to_its_longest_pause() {
    let pauses: Vec<u64> = (1..=6)
        .map(|n| Backoff::STANDARD.after(n).as_secs())
        .collect();
    assert_eq!(pauses, [1, 2, 4, 8, 16, 30]);
    assert_eq!(Backoff::STANDARD.after(1000), Duration::from_secs(30));
}

#[tokio::test]
async fn a_failing_service_is_restarted_with_growing_pauses_and_the_others_run_on() {
    let events = Events::default();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let (ready, restarted) = tokio::sync::oneshot::channel();
    let mut ready = Some(ready);
    let supervisor = Supervisor::new(Duration::from_secs(1))
        .service(
            "steady",
            OnFailure::StopAll,
            polite(&events, "steady", Duration::ZERO),
        )
        .service("flaky", OnFailure::Restart(QUICK), {
            let starts = starts.clone();
            move |token: CancellationToken| {
                let runs = {
                    let mut starts = starts.lock().unwrap();
                    starts.push(Instant::now());
                    starts.len()
                };
                // Fails twice, panics once, then runs until stopped.
                let ready = (runs == 4).then(|| ready.take()).flatten();
                async move {
                    match runs {
                        1 | 2 => anyhow::bail!("run {runs} failed"),
                        3 => panic!("run 3 panicked"),
                        _ => {
                            if let Some(ready) = ready {
                                let _ = ready.send(());
                            }
                            token.cancelled().await;
                            Ok(())
                        }
                    }
                }
            }
        });
    let stopped = supervisor
        .run_until(async {
            let _ = restarted.await;
            "test"
        })
        .await
        .unwrap();
    assert_eq!(stopped.by, "test");
    assert!(stopped.overran.is_empty());
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 4);
    let pauses: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    for (pause, least) in pauses.iter().zip([20, 40, 80]) {
        assert!(
            *pause >= Duration::from_millis(least),
            "{pauses:?}: pause {least} ms expected"
        );
    }
    // The steady service was never restarted.
    assert_eq!(events.take(), ["steady started", "steady stopped"]);
}

#[tokio::test]
async fn services_start_in_order_and_are_awaited_in_reverse_order() {
    let events = Events::default();
    let stopped = Supervisor::new(Duration::from_secs(5))
        // The first registered stops fastest, yet is seen stopped last.
        .service(
            "http",
            OnFailure::Restart(QUICK),
            polite(&events, "http", Duration::ZERO),
        )
        .service(
            "dispatcher",
            OnFailure::Restart(QUICK),
            polite(&events, "dispatcher", Duration::from_millis(20)),
        )
        .service(
            "workers",
            OnFailure::StopAll,
            polite(&events, "workers", Duration::from_millis(60)),
        )
        .run_until(async {
            events.started(3).await;
            "SIGTERM"
        })
        .await
        .unwrap();
    assert_eq!(stopped.order, ["workers", "dispatcher", "http"]);
    assert!(stopped.overran.is_empty());
    let events = events.take();
    assert_eq!(
        events[..3],
        ["http started", "dispatcher started", "workers started"]
    );
    // Told together: each stopped in its own time, none waited for another.
    assert_eq!(
        events[3..],
        ["http stopped", "dispatcher stopped", "workers stopped"]
    );
}

#[tokio::test]
async fn a_service_still_running_at_the_end_of_the_grace_period_is_named_and_aborted() {
    let events = Events::default();
    let aborted = Arc::new(AtomicBool::new(false));
    /// Sets its flag when dropped: the task was aborted.
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let grace = Duration::from_millis(100);
    let begun = Instant::now();
    let stopped = Supervisor::new(grace)
        .service(
            "http",
            OnFailure::Restart(QUICK),
            polite(&events, "http", Duration::ZERO),
        )
        .service("stubborn", OnFailure::StopAll, {
            let aborted = aborted.clone();
            move |_token| {
                let guard = OnDrop(aborted.clone());
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    Ok::<(), anyhow::Error>(())
                }
            }
        })
        .run_until(std::future::ready("SIGTERM"))
        .await
        .unwrap();
    assert_eq!(stopped.overran, ["stubborn"]);
    assert_eq!(stopped.order, ["stubborn", "http"]);
    assert!(begun.elapsed() < grace * 5, "{:?}", begun.elapsed());
    // Given the same deadline, the one that listened stopped.
    assert_eq!(events.take(), ["http started", "http stopped"]);
    tokio::task::yield_now().await;
    assert!(
        aborted.load(Ordering::SeqCst),
        "the overrunning run was aborted"
    );
}

#[tokio::test]
async fn the_callers_shutdown_future_stops_the_services_and_names_itself() {
    let events = Events::default();
    let (stop, stopped_by_caller) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        Supervisor::new(Duration::from_secs(1))
            .service(
                "workers",
                OnFailure::StopAll,
                polite(&events, "workers", Duration::ZERO),
            )
            .run_until(async {
                let _ = stopped_by_caller.await;
                "the application"
            }),
    );
    events.started(1).await;
    assert!(!run.is_finished(), "runs until the caller says stop");
    stop.send(()).unwrap();
    let stopped = run.await.unwrap().unwrap();
    assert_eq!(stopped.by, "the application");
    assert_eq!(events.take(), ["workers started", "workers stopped"]);
}

#[tokio::test]
async fn a_service_whose_failure_stops_all_ends_the_run_with_its_error() {
    let events = Events::default();
    let runs = Arc::new(AtomicU32::new(0));
    let error = Supervisor::new(Duration::from_secs(1))
        .service(
            "http",
            OnFailure::Restart(QUICK),
            polite(&events, "http", Duration::ZERO),
        )
        .service("workers", OnFailure::StopAll, {
            let runs = runs.clone();
            move |_token| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { anyhow::bail!("a queue worker stopped with an error") }
            }
        })
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "a queue worker stopped with an error");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not restarted");
    assert_eq!(events.take(), ["http started", "http stopped"]);
}
