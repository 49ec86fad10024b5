//! What a bench run prints: one paragraph per phase as it ends, and the
//! summary at the end.

use std::collections::BTreeMap;

use super::report::{BenchReport, PendingReport, PhaseReport, RunReport, Verdict, slowest_seconds};
use super::sys;

fn fmt_usage(u: &BTreeMap<String, sys::Usage>) -> String {
    u.iter()
        .map(|(k, v)| match (v.cpu_cores, v.mem_peak_mib) {
            (Some(c), Some(m)) => format!("{k} {:.0}% CPU {m:.0} MiB", c * 100.0),
            (None, Some(m)) => format!("{k} ? CPU {m:.0} MiB"),
            _ if v.processes == 0 => format!("{k} not running"),
            _ => format!("{k} unreadable"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `broker 0.62, postgres 0.45, … ms; all 1.57 ms; the service's own 0.25
/// ms (16 %)`: CPU time per order of the design's processes.
fn fmt_cpu_per_order(p: &PhaseReport) -> String {
    let per: Vec<String> = p
        .cpu_ms_per_order
        .iter()
        .map(|(k, ms)| format!("{k} {ms:.2}"))
        .collect();
    let own_name = match p.own_process.as_str() {
        "seed" => "the seed consumer's",
        _ => "the service's",
    };
    let own = p.cpu_ms_per_order.get(&p.own_process);
    match (p.cpu_ms_per_order_total, own) {
        (Some(total), Some(own)) if total > 0.0 => format!(
            "{} ms; all {total:.2} ms; {own_name} own {own:.2} ms ({:.0} %)",
            per.join(", "),
            own / total * 100.0
        ),
        _ => format!("{} ms; total unreadable", per.join(", ")),
    }
}

/// `bench 0.20, service 0.16, inventory 0.05 ms; the server's own 0.01
/// ms`: PostgreSQL's CPU per order by whose statements it ran; `None`
/// when it was not split.
fn fmt_postgres_by_client(p: &PhaseReport) -> Option<String> {
    if p.postgres_ms_per_order_by_client.is_empty() {
        return None;
    }
    let per: Vec<String> = p
        .postgres_ms_per_order_by_client
        .iter()
        .map(|(k, ms)| format!("{k} {ms:.2}"))
        .collect();
    let rest = p
        .cpu_ms_per_order
        .get("postgres")
        .map(|all| all - p.postgres_ms_per_order_by_client.values().sum::<f64>())
        .map(|rest| format!("; the server's own {:.2} ms", rest.max(0.0)))
        .unwrap_or_default();
    Some(format!("{} ms{rest}", per.join(", ")))
}

/// `broker 14.5 (36 µs), …`: context switches per order of each process
/// and the CPU each one came with; `None` when none were read.
fn fmt_switches(p: &PhaseReport) -> Option<String> {
    if p.switches_per_order.is_empty() {
        return None;
    }
    let per: Vec<String> = p
        .switches_per_order
        .iter()
        .map(|(k, n)| match p.cpu_ms_per_order.get(k) {
            Some(ms) if *n > 0.0 => format!("{k} {n:.1} ({:.0} µs)", ms * 1000.0 / n),
            _ => format!("{k} {n:.1}"),
        })
        .collect();
    Some(per.join(", "))
}

/// The phase's CPU per order: per process, PostgreSQL's by client, and
/// the context switches behind it.
fn print_cpu(p: &PhaseReport) {
    println!("   CPU per order: {}", fmt_cpu_per_order(p));
    if let Some(line) = fmt_postgres_by_client(p) {
        println!("   PostgreSQL's CPU per order by whose statements it ran: {line}");
    }
    if let Some(line) = fmt_switches(p) {
        println!("   context switches per order (CPU per switch): {line}");
    }
}

/// The first number of a `/proc/loadavg` line (the 1-minute average).
fn load1(loadavg: &str) -> &str {
    loadavg.split_whitespace().next().unwrap_or("?")
}

/// What the `--flood` clients got, when there were any.
fn print_flood(p: &PhaseReport) {
    if let Some(f) = &p.flood {
        let statuses: Vec<String> = f
            .by_status
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        println!(
            "   flood: {} clients, {:.0} requests/s for {:.0} s (by status: {})",
            f.clients,
            f.per_second,
            f.seconds,
            statuses.join(", ")
        );
    }
    if let Some(split) = &p.flood_split {
        let line = |l: &super::report::LatenessStats| {
            format!(
                "{} orders, p50 {:.1} / p99 {:.1} / max {:.1} ms",
                l.count, l.p50_ms, l.p99_ms, l.max_ms
            )
        };
        println!(
            "   in turns ({} flooded): quiet {}; flooded {}; p99 flooded - quiet {:+.1} ms",
            split.windows,
            line(&split.quiet),
            line(&split.flooded),
            split.flooded.p99_ms - split.quiet.p99_ms
        );
    }
}

pub(super) fn print_phase(p: &PhaseReport) {
    let l = &p.lateness;
    println!(
        "{}, {}: {} orders at {:.0}/s (target {}), {} cancelled, {} paid; lateness p50 {:.1} / p90 {:.1} / p99 {:.1} / p99.9 {:.1} / max {:.1} ms; {} early, {} not cancelled; peak {} cancellations/s",
        p.design,
        p.workload,
        p.orders,
        p.achieved_rate,
        p.target_rate,
        p.cancelled,
        p.paid,
        l.p50_ms,
        l.p90_ms,
        l.p99_ms,
        l.p999_ms,
        l.max_ms,
        l.early,
        p.not_cancelled,
        p.peak_cancel_rate
    );
    if p.late_payments > 0 {
        println!(
            "   {} payments came after the deadline (the generator fell behind) and were refused; those orders were cancelled",
            p.late_payments
        );
    }
    print_flood(p);
    println!("   resources: {}", fmt_usage(&p.resources));
    print_cpu(p);
    if p.swept > 0 {
        println!(
            "   {} orders were settled by the service's sweeper, not by their timeout message",
            p.swept
        );
    }
    let stages: Vec<String> = p
        .service_metrics
        .iter()
        .filter_map(|(k, sum)| {
            let stage = k
                .strip_prefix("order_timeout_stage_duration_seconds_sum{stage=\"")?
                .strip_suffix("\"}")?;
            let count = p.service_metrics.get(&k.replace("_sum{", "_count{"))?;
            Some(format!(
                "{stage} {count:.0} calls, mean {:.1} ms",
                sum / count.max(1.0) * 1000.0
            ))
        })
        .collect();
    if !stages.is_empty() {
        println!("   service stages: {}", stages.join("; "));
    }
    println!("   loadavg: {} -> {}", p.loadavg.0, p.loadavg.1);
    print_slow_seconds(p);
    for f in &p.failures {
        println!("   FAIL: {f}");
    }
}

/// The phase's three slowest seconds (by deadline) and what the database
/// server did meanwhile, on the same clock: where a run's p99 comes from a
/// few seconds' stall, what else was happening then.
fn print_slow_seconds(p: &PhaseReport) {
    let slowest: Vec<String> = slowest_seconds(&p.per_second, 3)
        .iter()
        .map(|s| format!("{} s p99 {:.1} ms", s.t_s, s.p99_ms))
        .collect();
    if !slowest.is_empty() {
        println!(
            "   slowest seconds (by deadline, since the first order): {}",
            slowest.join(", ")
        );
    }
    for e in &p.db_events {
        println!(
            "   database server: {} at {:.1} s, for {:.0} ms",
            e.what, e.t_s, e.took_ms
        );
    }
}

/// `--baseline broker-paths`: one line per path, its median over the
/// rounds and their range.
fn print_paths(costs: &[super::report::PathCost]) {
    use super::paths::summarize;
    use super::report::median;
    if costs.is_empty() {
        return;
    }
    let rounds = costs.iter().map(|c| c.round).max().unwrap_or(1);
    println!(
        "broker CPU per message, paced, no database (TTL {:?}; median of {rounds} round(s), range):",
        super::paths::PATH_TTL
    );
    for p in summarize(costs) {
        let range = |v: &[f64], digits: usize| match median(v) {
            None => "?".to_owned(),
            Some(m) if v.len() == 1 => format!("{m:.digits$}"),
            Some(m) => {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{m:.digits$} ({lo:.digits$}–{hi:.digits$})")
            }
        };
        println!(
            "   {}: {} ms, {} switches; {} not consumed — {}",
            p.path,
            range(&p.ms, 3),
            range(&p.switches, 1),
            p.lost,
            p.what
        );
    }
}

pub(super) fn print_summary(r: &BenchReport) {
    println!("== summary");
    if let Some(c) = &r.broker_ceiling {
        println!(
            "broker ceiling ({}, one hop, {} ms TTL): {:.0} msg/s sustained while publishing, {:.0} msg/s first to last delivery ({:.0}/s published); resources: {}",
            c.queue_type,
            c.ttl_ms,
            c.sustained_rate.unwrap_or(0.0),
            c.consume_rate,
            c.publish_rate,
            fmt_usage(&c.resources)
        );
    }
    print_paths(&r.broker_paths);
    if let [run] = r.runs.as_slice() {
        for p in &run.phases {
            print_phase(p);
            if let Some(ceiling) = r.broker_ceiling.as_ref().and_then(|c| c.sustained_rate)
                && ceiling > 0.0
            {
                println!(
                    "   = {:.0}% of the one-hop broker ceiling",
                    p.achieved_rate / ceiling * 100.0
                );
            }
        }
    } else {
        for run in &r.runs {
            print_run(run);
        }
    }
    for v in &r.verdicts {
        print_verdict(v);
    }
    if let Some(p) = &r.pending {
        print_pending(p);
    }
}

fn print_pending(p: &PendingReport) {
    println!(
        "pending: {} orders ({}); declare {:.2} s, publish {:.1} s, all in the cascade after {:.1} s",
        p.orders, p.timeouts, p.declare_seconds, p.publish_seconds, p.fill_seconds
    );
    println!(
        "   broker: queue memory {:?} MiB, broker memory {:?} -> {:?} MiB, data dir {:?} -> {:?} MiB",
        p.queue_memory_mib.map(|m| m.round()),
        p.broker_memory_mib.0.map(|m| m.round()),
        p.broker_memory_mib.1.map(|m| m.round()),
        p.broker_disk_mib.0.map(|m| m.round()),
        p.broker_disk_mib.1.map(|m| m.round())
    );
    let svc: Vec<String> = p
        .service_memory
        .iter()
        .step_by((p.service_memory.len() / 10).max(1))
        .map(|s| format!("{:.0}s:{:.0}", s.t_s, s.mib))
        .collect();
    println!("   service memory over time (s:MiB): {}", svc.join(" "));
    println!("   resources: {}", fmt_usage(&p.resources));
    println!("   queues: {:?}", p.queue_messages);
    for f in &p.failures {
        println!("   FAIL: {f}");
    }
}

/// One line per design of a run: `run 2 service: …`.
pub(super) fn print_run(r: &RunReport) {
    for p in &r.phases {
        let l = &p.lateness;
        println!(
            "run {} {}: {} orders at {:.0}/s, lateness p50 {:.1} / p99 {:.1} / max {:.1} ms, {} early, {} not cancelled, {} swept; CPU {} ms/order ({} {}); load {} -> {}; {}",
            r.run,
            p.design,
            p.orders,
            p.achieved_rate,
            l.p50_ms,
            l.p99_ms,
            l.max_ms,
            l.early,
            p.not_cancelled,
            p.swept,
            p.cpu_ms_per_order_total
                .map_or("?".into(), |t| format!("{t:.2}")),
            p.own_process,
            p.cpu_ms_per_order
                .get(&p.own_process)
                .map_or("?".into(), |t| format!("{t:.2}")),
            load1(&p.loadavg.0),
            load1(&p.loadavg.1),
            if p.failures.is_empty() {
                "checks passed".to_owned()
            } else {
                format!("CHECKS FAILED: {}", p.failures.join("; "))
            }
        );
    }
}

/// `verdict service: 3 of 5 runs within p99 <= 50 ms …: NOT STABLE`.
fn print_verdict(v: &Verdict) {
    let p99s: Vec<String> = v.p99_ms.iter().map(|p| format!("{p:.1}")).collect();
    let word = match (v.runs, v.stable) {
        (1, true) => "within target",
        (1, false) => "NOT within target",
        (_, true) => "STABLE",
        (_, false) => "NOT STABLE",
    };
    println!(
        "verdict {}: {} of {} runs with p99 <= {:.0} ms and every check passed (p99 {} ms): {word}",
        v.design,
        v.within_target,
        v.runs,
        v.p99_target_ms,
        p99s.join(", ")
    );
}
