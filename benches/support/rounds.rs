//! Side-by-side rounds: variants measured in turns, the first round unmeasured, medians
//! compared. Include with `#[path = "support/rounds.rs"] mod rounds;`.

use std::future::Future;

/// The median of `v` (sorted in place).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `rounds + 1` rounds of every variant of `names`, each round starting one variant
/// later, so that none always runs first; `run(variant)` gives a rate. Round 0 warms up
/// and is not kept. Each kept rate is printed and passed to `record(variant, round,
/// rate)`. Returns each variant's median.
pub(crate) async fn side_by_side<F, Fut>(
    rounds: usize,
    names: &[&str],
    mut run: F,
    mut record: impl FnMut(usize, usize, f64),
) -> Vec<f64>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = f64>,
{
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..=rounds {
        for k in 0..names.len() {
            let i = (k + round) % names.len();
            let rate = run(i).await;
            eprintln!("round {round} {}: {rate:.0}/s", names[i]);
            if round > 0 {
                rates[i].push(rate);
                record(i, round, rate);
            }
        }
    }
    rates.iter_mut().map(|r| if r.is_empty() { 0.0 } else { median(r) }).collect()
}
