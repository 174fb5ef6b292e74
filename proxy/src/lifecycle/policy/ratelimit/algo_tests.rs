//! The algorithms with an explicit clock: every expected count is worked out by hand in the
//! comment above it.

use super::*;

/// One counter of a limit, driven by hand.
struct Counter {
    specs: Vec<Spec>,
    states: Vec<RateState>,
}

fn counter(alg: Algorithm, rates: &[(u64, u64)], now: i64) -> Counter {
    let specs: Vec<Spec> = rates
        .iter()
        .map(|&(limit, window_ms)| Spec::new(alg, &Rate { limit, window_ms }).unwrap())
        .collect();
    let states = specs.iter().map(|s| s.fresh(now)).collect();
    Counter { specs, states }
}

impl Counter {
    fn hit(&mut self, now: i64) -> Decision {
        let allowed = decide(&self.specs, &mut self.states, now);
        decision(&self.specs, &self.states, now, allowed)
    }

    /// Sends `n` requests at `now`, returns how many were admitted.
    fn hits(&mut self, n: usize, now: i64) -> usize {
        (0..n).filter(|_| self.hit(now).allowed).count()
    }
}

#[test]
fn token_bucket_capacity_10_refill_5_per_second() {
    // Capacity 10, refilled 10 per 2 s = 5/s.
    let mut c = counter(Algorithm::TokenBucket, &[(10, 2_000)], 0);
    assert_eq!(
        c.hits(15, 0),
        10,
        "the full bucket admits 10, then refuses 5"
    );
    // 0.4 s × 5/s = 2 tokens.
    assert_eq!(c.hits(2, 400), 2, "two refilled tokens admit two");
    let d = c.hit(400);
    assert!(!d.allowed, "and not a third");
    // One token takes 200 ms; a full bucket 2 s.
    assert_eq!(d.retry_after, Some(Duration::from_millis(200)));
    assert_eq!(d.reset_after, Duration::from_millis(2_000));
    assert_eq!((d.limit, d.remaining), (10, 0));
    assert!(!c.hit(599).allowed);
    assert!(c.hit(600).allowed, "admitted exactly when Retry-After said");
}

#[test]
fn token_bucket_never_holds_more_than_its_capacity() {
    let mut c = counter(Algorithm::TokenBucket, &[(10, 2_000)], 0);
    assert_eq!(c.hits(3, 0), 3);
    // An hour idle refills to 10, not more.
    assert_eq!(c.hits(20, 3_600_000), 10);
}

#[test]
fn sliding_window_weighs_the_previous_window_by_what_is_left_of_it() {
    // 10 per second; windows [0, 1000), [1000, 2000), ...
    let mut c = counter(Algorithm::SlidingWindow, &[(10, 1_000)], 500);
    assert_eq!(c.hits(12, 500), 10, "an empty history admits the limit");
    // t=1000: the previous 10 weigh 10 × 1000/1000 = 10: nothing fits.
    assert_eq!(
        c.hits(3, 1_000),
        0,
        "at the boundary the previous window still counts whole"
    );
    // t=1250: 10 × 750/1000 = 7.5, so 2 fit (9.5), a third would make 10.5.
    assert_eq!(c.hits(5, 1_250), 2);
    // t=1500: 10 × 500/1000 + 2 = 7, so 3 fit.
    assert_eq!(c.hits(5, 1_500), 3);
    // t=2000: the previous window now holds 5 (2 + 3): 5 × 1000/1000 = 5, so 5 fit.
    assert_eq!(c.hits(8, 2_000), 5);
    // t=3500: the previous window [2000, 3000) holds 5, weighing 5 × 500/1000 = 2.5: 7 fit.
    assert_eq!(c.hits(9, 3_500), 7);
    // t=5000: the previous window [4000, 5000) is empty: the full limit again.
    assert_eq!(c.hits(11, 5_000), 10);
}

#[test]
fn sliding_window_retry_after_is_exact() {
    let mut c = counter(Algorithm::SlidingWindow, &[(10, 1_000)], 0);
    assert_eq!(c.hits(10, 0), 10);
    // At 1000 the previous 10 weigh 10 × (1000 − e)/1000; one more fits when that is ≤ 9,
    // i.e. e ≥ 100.
    let d = c.hit(1_000);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
    assert!(!c.hit(1_099).allowed);
    assert!(c.hit(1_100).allowed);
}

#[test]
fn sliding_window_full_current_window_waits_for_the_next_one() {
    let mut c = counter(Algorithm::SlidingWindow, &[(4, 1_000)], 0);
    assert_eq!(c.hits(4, 200), 4);
    // Current window full: wait until 1000, where the 4 weigh 4 × (1000 − t)/1000 ≤ 3 from
    // t = 250: 800 + 250 ms from t=200.
    let d = c.hit(200);
    assert_eq!(d.retry_after, Some(Duration::from_millis(1_050)));
    assert_eq!(d.reset_after, Duration::from_millis(800));
    assert!(!c.hit(1_249).allowed);
    assert!(c.hit(1_250).allowed);
}

#[test]
fn fixed_window_resets_at_the_window_boundary() {
    let mut c = counter(Algorithm::FixedWindow, &[(3, 1_000)], 0);
    assert_eq!(c.hits(5, 0), 3);
    let d = c.hit(999);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_millis(1)));
    assert_eq!(d.reset_after, Duration::from_millis(1));
    assert_eq!(c.hits(5, 1_000), 3, "a new window admits the limit again");
    // Windows are aligned on the epoch, not on the first request: a counter started at 2500
    // resets at 3000.
    let mut c = counter(Algorithm::FixedWindow, &[(3, 1_000)], 2_500);
    assert_eq!(c.hits(5, 2_500), 3);
    assert_eq!(c.hits(5, 2_999), 0);
    assert_eq!(c.hits(5, 3_000), 3);
}

#[test]
fn several_rates_admit_only_when_all_do_and_a_denial_consumes_nothing() {
    // 5 per second and 8 per 10 seconds.
    let mut c = counter(Algorithm::FixedWindow, &[(5, 1_000), (8, 10_000)], 0);
    assert_eq!(
        c.hits(7, 0),
        5,
        "the per-second rate refuses the 6th and 7th"
    );
    assert_eq!(
        c.states[1].b, 5,
        "the 10 s rate did not count the refused ones"
    );
    assert_eq!(c.hits(7, 1_000), 3, "the 10 s rate has 3 left");
    assert_eq!(
        c.states[0].b, 3,
        "the per-second rate did not count the refused ones"
    );
    let d = c.hit(1_500);
    assert!(!d.allowed);
    assert_eq!(d.limit, 8, "the refusing rate is the one reported");
    assert_eq!(d.retry_after, Some(Duration::from_millis(8_500)));
}

#[test]
fn the_admitted_decision_reports_the_rate_with_fewest_left() {
    let mut c = counter(Algorithm::FixedWindow, &[(5, 1_000), (100, 60_000)], 0);
    let d = c.hit(0);
    assert!(d.allowed);
    assert_eq!((d.limit, d.remaining), (5, 4));
    assert_eq!(d.reset_after, Duration::from_millis(1_000));
    assert_eq!(d.retry_after, None);
    // When both have as many left, the longer reset is the more restrictive.
    let mut c = counter(Algorithm::FixedWindow, &[(5, 1_000), (5, 60_000)], 0);
    assert_eq!(c.hit(0).limit, 5);
    assert_eq!(c.hit(0).reset_after, Duration::from_millis(60_000));
}

#[test]
fn a_zero_limit_refuses_everything() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let mut c = counter(alg, &[(0, 1_000)], 0);
        let d = c.hit(0);
        assert!(!d.allowed, "{alg:?}");
        assert!(d.retry_after.is_some(), "{alg:?}");
    }
}

#[test]
fn a_clock_behind_the_state_counts_in_the_current_window() {
    let mut c = counter(Algorithm::FixedWindow, &[(3, 1_000)], 5_000);
    assert_eq!(c.hits(2, 5_000), 2);
    // Another replica's clock is 2 s behind: its requests still count against this window.
    assert_eq!(c.hits(5, 3_100), 1);
    let mut b = counter(Algorithm::TokenBucket, &[(3, 1_000)], 5_000);
    assert_eq!(b.hits(3, 5_000), 3);
    assert_eq!(
        b.hits(3, 4_000),
        0,
        "time running backwards refills nothing"
    );
}

#[test]
fn idle_ttl_is_when_a_counter_is_as_good_as_fresh() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let mut c = counter(alg, &[(10, 1_000)], 1_300);
        c.hits(4, 1_300);
        let spec = c.specs[0];
        let ttl = spec.idle_ttl(&c.states[0], 1_300);
        assert!(ttl > 0, "{alg:?}");
        let at = 1_300 + ttl;
        let mut s = c.states[0];
        spec.advance(&mut s, at);
        assert_eq!(s, spec.fresh(at), "{alg:?}: fresh after {ttl} ms");
        let mut s = c.states[0];
        spec.advance(&mut s, at - 1);
        assert_ne!(s, spec.fresh(at - 1), "{alg:?}: not yet 1 ms earlier");
    }
}

#[test]
fn record_puts_late_hits_in_the_window_they_happened_in() {
    let f = Spec::new(
        Algorithm::FixedWindow,
        &Rate {
            limit: 10,
            window_ms: 1_000,
        },
    )
    .unwrap();
    let mut s = f.fresh(2_100);
    f.record(&mut s, 1_900, 4);
    assert_eq!(s.b, 0, "fixed: a past window is gone");
    f.record(&mut s, 2_200, 3);
    assert_eq!(s.b, 3);
    let sw = Spec::new(
        Algorithm::SlidingWindow,
        &Rate {
            limit: 10,
            window_ms: 1_000,
        },
    )
    .unwrap();
    let mut s = sw.fresh(2_100);
    sw.record(&mut s, 1_900, 4);
    assert_eq!(
        (s.b, s.c),
        (0, 4),
        "sliding: the previous window still weighs"
    );
    sw.record(&mut s, 900, 4);
    assert_eq!((s.b, s.c), (0, 4), "older ones weigh nothing");
    sw.record(&mut s, 3_100, 2);
    assert_eq!(
        (s.a, s.b, s.c),
        (3_000, 2, 0),
        "later ones move the window on"
    );
    let t = Spec::new(
        Algorithm::TokenBucket,
        &Rate {
            limit: 10,
            window_ms: 1_000,
        },
    )
    .unwrap();
    let mut s = t.fresh(0);
    t.record(&mut s, 0, 15);
    assert_eq!(
        s.a, -5_000,
        "a bucket may go into debt (overshoot repaid by refill)"
    );
    t.advance(&mut s, 600);
    assert_eq!(s.a, 1_000);
}

#[test]
fn rates_too_large_to_count_exactly_are_refused() {
    let spec = |limit, window_ms| Spec::new(Algorithm::TokenBucket, &Rate { limit, window_ms });
    assert!(spec(10, 0).is_none(), "zero window");
    assert!(spec(u64::MAX, 2).is_none(), "overflow");
    assert!(spec(1 << 30, 1 << 23).is_none(), "2^53");
    assert!(
        spec(100_000_000, 86_400_000).is_some(),
        "100 M a day is fine"
    );
}

// ---- costs ----

impl Counter {
    /// A request that needs room for `need` units and counts `take`.
    fn pay(&mut self, need: i64, take: i64, now: i64) -> Decision {
        let cost = Cost { need, take };
        let allowed = decide_cost(&self.specs, &mut self.states, now, cost);
        decision_n(&self.specs, &self.states, now, allowed, need)
    }
}

#[test]
fn a_request_cost_is_admitted_only_when_the_whole_cost_fits() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let mut c = counter(alg, &[(10, 60_000)], 0);
        // 4 + 4 = 8 of 10: both fit; 8 + 4 = 12 does not, 8 + 2 = 10 does.
        assert!(c.pay(4, 4, 0).allowed, "{alg:?}");
        let d = c.pay(4, 4, 0);
        assert!(d.allowed && d.remaining == 2, "{alg:?}: {d:?}");
        let d = c.pay(4, 4, 0);
        assert!(!d.allowed, "{alg:?}: 12 > 10");
        assert_eq!(d.remaining, 2, "{alg:?}: a refusal counts nothing");
        assert!(c.pay(2, 2, 0).allowed, "{alg:?}: exactly the limit fits");
        assert!(!c.pay(1, 1, 0).allowed, "{alg:?}: and nothing more");
    }
}

#[test]
fn a_cost_over_the_limit_never_fits_and_retries_after_a_window() {
    let mut c = counter(Algorithm::SlidingWindow, &[(10, 1_000)], 0);
    let d = c.pay(11, 11, 0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_millis(1_000)));
    assert_eq!(d.remaining, 10, "nothing counted");
}

#[test]
fn retry_after_of_a_cost_is_the_wait_until_the_whole_cost_fits() {
    // Token bucket of 10 per 10 s (1 per second): 10 spent, a request of 3 waits 3 s.
    let mut c = counter(Algorithm::TokenBucket, &[(10, 10_000)], 0);
    assert!(c.pay(10, 10, 0).allowed);
    let d = c.pay(3, 3, 0);
    assert_eq!(d.retry_after, Some(Duration::from_millis(3_000)));
    assert!(!c.pay(3, 3, 2_999).allowed);
    assert!(c.pay(3, 3, 3_000).allowed, "admitted when Retry-After said");

    // Fixed window: the window's end, whatever the cost that fits a fresh window.
    let mut c = counter(Algorithm::FixedWindow, &[(10, 1_000)], 0);
    assert!(c.pay(9, 9, 200).allowed);
    assert_eq!(
        c.pay(5, 5, 200).retry_after,
        Some(Duration::from_millis(800))
    );

    // Sliding window of 10 per 1 s: 8 in the window [0, 1000). At 1000 they become the
    // previous window; a request of 5 fits once 8 × (1000 − e) / 1000 + 5 ≤ 10, so
    // e ≥ 375: at 1375.
    let mut c = counter(Algorithm::SlidingWindow, &[(10, 1_000)], 0);
    assert!(c.pay(8, 8, 0).allowed);
    let d = c.pay(5, 5, 1_000);
    assert_eq!(d.retry_after, Some(Duration::from_millis(375)));
    assert!(!c.pay(5, 5, 1_374).allowed);
    assert!(c.pay(5, 5, 1_375).allowed);
}

#[test]
fn a_zero_cost_needs_room_for_one_and_counts_nothing() {
    let mut c = counter(Algorithm::FixedWindow, &[(2, 1_000)], 0);
    assert!(c.pay(1, 0, 0).allowed);
    assert!(c.pay(1, 0, 0).allowed);
    assert_eq!(c.hits(3, 0), 2, "free requests left the counter as it was");
    assert!(
        !c.pay(1, 0, 0).allowed,
        "a full counter refuses even a free one"
    );
}

#[test]
fn a_response_cost_is_counted_after_the_fact_so_the_next_request_pays() {
    // 1000 tokens a minute, each answer costing 400: the third request is admitted at 800
    // and crosses the limit (1200); the fourth is refused.
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let mut c = counter(alg, &[(1_000, 60_000)], 0);
        for i in 0..3 {
            assert!(c.pay(1, 0, i).allowed, "{alg:?}: request {}", i + 1);
            add(&c.specs, &mut c.states, i, 400);
        }
        let d = c.pay(1, 0, 3);
        assert!(!d.allowed, "{alg:?}: the fourth is refused");
        assert_eq!(d.remaining, 0, "{alg:?}");
    }
}

#[test]
fn added_units_land_in_the_current_window() {
    let mut c = counter(Algorithm::FixedWindow, &[(10, 1_000)], 0);
    add(&c.specs, &mut c.states, 500, 10);
    assert!(!c.hit(999).allowed);
    // A new window: the units added in the previous one are gone.
    add(&c.specs, &mut c.states, 1_000, 3);
    assert_eq!(c.hits(10, 1_000), 7);
}
