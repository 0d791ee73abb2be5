//! The probe's run: connect, check and stamp through the owner, fault, poll
//! the survivors' ANA logs, verify each volume through the survivor that
//! says Optimized, sample the CPU, report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use nvme_wire::log_page::{ana::STATE_OPTIMIZED, lid};
use nvmf_host::{Controller, HostOptions};
use serde_json::{Value, json};

use super::cpu::{self, Samples};
use super::stamp::{self, AFTER, BEFORE};
use super::{FailoverArgs, Fault, Plan, ana};

/// How the fault's command ended: ms after the fault, its exit code, its last lines.
type RunEnd = (f64, Option<i32>, String);

/// Where one volume stands after the fault.
#[derive(Clone, Default)]
struct Vol {
    /// A probe through a survivor is under way.
    probing: bool,
    /// ms after the fault when a survivor first said Optimized.
    ana_ms: Option<f64>,
    /// ms after the fault when the probe through it succeeded (or found bad data).
    served_ms: Option<f64>,
    node: Option<String>,
    tries: u32,
    last_error: Option<String>,
    verify_error: Option<String>,
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

async fn connect(
    name: &str,
    addr: std::net::SocketAddr,
    nqn: &str,
    hostnqn: &Option<String>,
) -> Result<Controller> {
    let mut o = HostOptions {
        nr_io_queues: 2,
        queue_depth: 128,
        timeout: Duration::from_secs(3),
        kato_ms: 10_000,
        ..HostOptions::default()
    };
    if let Some(h) = hostnqn {
        o.hostnqn = h.clone();
    }
    Controller::connect(addr, nqn, o)
        .await
        .with_context(|| format!("connecting to {name} ({addr})"))
}

async fn ana_states(c: &Controller, vols: usize) -> Result<std::collections::HashMap<u32, u8>> {
    let log = c.get_log_page(lid::ANA, ana::len_for(vols), 0).await?;
    ana::states(&log).context("a malformed ANA log")
}

/// Read `lba` and compare it with `want`: Ok(None) if equal, Ok(Some(why)) if not.
async fn read_check(
    c: &Controller,
    qid: u16,
    nsid: u32,
    lba: u64,
    want: &[u8],
) -> Result<Option<String>> {
    let mut got = vec![0u8; want.len()];
    c.read(qid, nsid, lba, 1, &mut got).await?;
    if got == want {
        return Ok(None);
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    Ok(Some(format!(
        "LBA {lba}: {} bytes differ, first at byte {first}{}",
        got.iter().zip(want).filter(|(a, b)| a != b).count(),
        if got.iter().all(|&b| b == 0) {
            " (all zeroes)"
        } else {
            ""
        }
    )))
}

pub(super) async fn run(args: &FailoverArgs, plan: &Plan) -> Result<Value> {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_nanos() as u64;
    // ---- connect to every node, as a multipath host is before a fault
    let mut ctrls = Vec::new();
    for (name, addr) in &plan.ctrls {
        ctrls.push(Arc::new(
            connect(name, *addr, &args.nqn, &args.hostnqn).await?,
        ));
    }
    let owner = ctrls[plan.owner].clone();
    let oname = &plan.ctrls[plan.owner].0;
    let nv = plan.volumes.len();
    // ---- the owner serves every volume (a move just before may still settle)
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = ana_states(&owner, nv).await?;
        let not: Vec<&str> = plan
            .volumes
            .iter()
            .filter(|(_, id)| s.get(id) != Some(&STATE_OPTIMIZED))
            .map(|(n, _)| n.as_str())
            .collect();
        if not.is_empty() {
            break; // every volume Optimized on the owner
        }
        if Instant::now() > until {
            bail!(
                "{oname} does not report these volumes Optimized: {}",
                not.join(" ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ---- one block through the owner, read back
    let mut lba = Vec::with_capacity(nv);
    for (name, nsid) in &plan.volumes {
        let ns = owner
            .identify_namespace(*nsid)
            .await
            .with_context(|| format!("volume {name} (nsid {nsid}) on {oname}"))?;
        lba.push(ns.lba_size as usize);
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, (name, nsid)) in plan.volumes.iter().enumerate() {
        let (c, name, nsid, len) = (owner.clone(), name.clone(), *nsid, lba[i]);
        set.spawn(async move {
            let b = stamp::block(len, seed, nsid, BEFORE);
            let qid = 1 + (nsid % 2) as u16;
            c.write(qid, nsid, 0, 1, &b)
                .await
                .with_context(|| format!("writing {name} on the owner"))?;
            if let Some(why) = read_check(&c, qid, nsid, 0, &b).await? {
                bail!("{name}: the owner read back another block than it was given: {why}");
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    // ---- the CPU baseline, then the fault
    let stop = Arc::new(AtomicBool::new(false));
    let pids: Vec<u32> = plan.watch.iter().map(|(_, p)| *p).collect();
    let sampler = (!pids.is_empty()).then(|| {
        cpu::sample(
            pids.clone(),
            args.cpu_interval,
            Instant::now(),
            stop.clone(),
        )
    });
    if sampler.is_some() {
        tokio::time::sleep(args.baseline).await;
    }
    let run_result: Arc<Mutex<Option<RunEnd>>> = Arc::default();
    let t0 = Instant::now();
    let fault = match &plan.fault {
        Fault::Signal { pid, sig, name } => {
            // SAFETY: kill(2) has no memory effects.
            if unsafe { libc::kill(*pid, *sig) } != 0 {
                bail!("kill -{name} {pid}: {}", std::io::Error::last_os_error());
            }
            format!("{name} to {oname} (pid {pid})")
        }
        Fault::Run(cmd) => {
            let child = std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {cmd}"))?;
            let rr = run_result.clone();
            std::thread::spawn(move || {
                let o = child.wait_with_output();
                let t = ms(t0);
                let (code, text) = match o {
                    Ok(o) => (
                        o.status.code(),
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&o.stdout),
                            String::from_utf8_lossy(&o.stderr)
                        ),
                    ),
                    Err(e) => (None, e.to_string()),
                };
                let tail: String = text
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                *rr.lock().unwrap_or_else(|e| e.into_inner()) = Some((t, code, tail));
            });
            format!("`{cmd}`")
        }
    };
    // ---- poll every other node's ANA log; probe each volume it says Optimized
    let vols: Arc<Mutex<Vec<Vol>>> = Arc::new(Mutex::new(vec![Vol::default(); nv]));
    let poll_errors: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; ctrls.len()]));
    let done = Arc::new(AtomicBool::new(false));
    let mut pollers = Vec::new();
    for (ci, c) in ctrls.iter().enumerate() {
        if ci == plan.owner {
            continue;
        }
        let (c, vols, errs, done) = (c.clone(), vols.clone(), poll_errors.clone(), done.clone());
        let cname = plan.ctrls[ci].0.clone();
        let volumes = plan.volumes.clone();
        let lba = lba.clone();
        let every = args.interval;
        pollers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !done.load(Ordering::Relaxed) {
                tick.tick().await;
                let s = match ana_states(&c, volumes.len()).await {
                    Ok(s) => s,
                    Err(_) => {
                        errs.lock().unwrap_or_else(|e| e.into_inner())[ci] += 1;
                        continue;
                    }
                };
                for (i, (_, nsid)) in volumes.iter().enumerate() {
                    if s.get(nsid) != Some(&STATE_OPTIMIZED) {
                        continue;
                    }
                    {
                        let mut v = vols.lock().unwrap_or_else(|e| e.into_inner());
                        let v = &mut v[i];
                        if v.probing || v.served_ms.is_some() {
                            continue;
                        }
                        v.probing = true;
                        v.ana_ms.get_or_insert(ms(t0));
                    }
                    let (c, vols, cname, nsid, len) =
                        (c.clone(), vols.clone(), cname.clone(), *nsid, lba[i]);
                    tokio::spawn(async move {
                        let r = verify(&c, nsid, len, seed).await;
                        let t = ms(t0);
                        let mut v = vols.lock().unwrap_or_else(|e| e.into_inner());
                        let v = &mut v[i];
                        v.probing = false;
                        v.tries += 1;
                        match r {
                            Ok(None) => {
                                v.served_ms = Some(t);
                                v.node = Some(cname);
                            }
                            Ok(Some(why)) => {
                                v.served_ms = Some(t);
                                v.node = Some(cname);
                                v.verify_error = Some(why);
                            }
                            Err(e) => v.last_error = Some(format!("{cname}: {e:#}")),
                        }
                    });
                }
            }
        }));
    }
    let deadline = t0 + args.timeout;
    loop {
        let all = vols
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .all(|v| v.served_ms.is_some());
        if all || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    done.store(true, Ordering::Relaxed);
    let vols = vols.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let last_ms = vols
        .iter()
        .filter_map(|v| v.served_ms)
        .fold(0.0f64, f64::max);
    // ---- the CPU after the last volume; the command's end
    let mut cpu_report = Value::Null;
    if let Some(h) = sampler {
        let end = t0 + Duration::from_secs_f64(last_ms / 1e3) + args.after;
        if let Some(d) = end.checked_duration_since(Instant::now()) {
            tokio::time::sleep(d).await;
        }
        stop.store(true, Ordering::Relaxed);
        let (at, rows) = h
            .join()
            .map_err(|_| anyhow::anyhow!("the CPU sampler panicked"))?;
        let mut s = Samples::default();
        for (a, r) in at.iter().zip(&rows) {
            let t = a
                .checked_duration_since(t0)
                .map_or_else(|| -(t0 - *a).as_secs_f64(), |d| d.as_secs_f64());
            s.push(t, r);
        }
        let tl = last_ms / 1e3;
        let after = args.after.as_secs_f64();
        let base = args.baseline.as_secs_f64();
        let procs: Vec<Value> = plan
            .watch
            .iter()
            .enumerate()
            .map(|(i, (n, p))| {
                json!({"name": n, "pid": p,
                       "baseline_cores": s.cpu_s(Some(i), -base, 0.0) / base.max(1e-3),
                       "to_last_s": s.cpu_s(Some(i), 0.0, tl),
                       "after_s": s.cpu_s(Some(i), tl, tl + after)})
            })
            .collect();
        // quiet: back to the idle baseline (etcd's heartbeats, the nodes' lease keep-alives)
        // plus --quiet-cores
        let baseline = s.cpu_s(None, -base, 0.0) / base.max(1e-3);
        let threshold = baseline + args.quiet_cores;
        let k = (args.quiet_window.as_secs_f64() / args.cpu_interval.as_secs_f64().max(1e-3))
            .round() as usize;
        cpu_report = json!({
            "interval_ms": args.cpu_interval.as_secs_f64() * 1e3,
            "baseline_cores": baseline,
            "to_last_s": s.cpu_s(None, 0.0, tl),
            "after_s": s.cpu_s(None, tl, tl + after),
            "after_window_s": after,
            "quiet_threshold_cores": threshold,
            "quiet_window_ms": args.quiet_window.as_secs_f64() * 1e3,
            "quiet_after_s": s.quiet_after(tl, threshold, k),
            // the watched processes' CPU seconds together, sampled: [s since the fault, CPU s]
            "samples": s.at.iter().zip(&s.ns).map(|(t, r)| json!([t, r.iter().sum::<u64>() as f64 / 1e9])).collect::<Vec<_>>(),
            "procs": procs,
        });
    }
    if matches!(plan.fault, Fault::Run(_)) {
        while run_result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
            && Instant::now() < deadline + Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for p in pollers {
        p.abort();
    }
    // ---- the report
    let mut served: Vec<f64> = vols.iter().filter_map(|v| v.served_ms).collect();
    served.sort_by(f64::total_cmp);
    let pick = |q: f64| -> Value {
        if served.is_empty() {
            return Value::Null;
        }
        let i = ((served.len() - 1) as f64 * q).round() as usize;
        json!(served[i])
    };
    let median = if served.is_empty() {
        Value::Null
    } else if served.len() % 2 == 1 {
        json!(served[served.len() / 2])
    } else {
        json!((served[served.len() / 2 - 1] + served[served.len() / 2]) / 2.0)
    };
    let per: Vec<Value> = plan
        .volumes
        .iter()
        .zip(&vols)
        .map(|((n, id), v)| {
            json!({"name": n, "nsid": id, "node": v.node, "ana_ms": v.ana_ms, "served_ms": v.served_ms,
                   "tries": v.tries, "last_error": v.last_error, "verify_error": v.verify_error})
        })
        .collect();
    let run = run_result.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let errs = poll_errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(json!({
        "fault": fault,
        "owner": oname,
        "seed": seed,
        "volumes_n": nv,
        "served": served.len(),
        "missing": plan.volumes.iter().zip(&vols).filter(|(_, v)| v.served_ms.is_none()).map(|((n, _), _)| n).collect::<Vec<_>>(),
        "verify_errors": vols.iter().filter(|v| v.verify_error.is_some()).count(),
        "first_ms": pick(0.0),
        "median_ms": median,
        "last_ms": pick(1.0),
        "by_node": plan.ctrls.iter().map(|(n, _)| (n.clone(), json!(vols.iter().filter(|v| v.node.as_deref() == Some(n)).count()))).collect::<serde_json::Map<_, _>>(),
        "poll_errors": plan.ctrls.iter().zip(&errs).map(|((n, _), e)| (n.clone(), json!(e))).collect::<serde_json::Map<_, _>>(),
        "run": run.map(|(t, code, tail)| json!({"ms": t, "exit": code, "output": tail})),
        "cpu": cpu_report,
        "volumes": per,
    }))
}

/// The survivor's side of one volume: the block written before the fault is
/// there, a new one goes in and comes back. Err: a command failed (tried again
/// at the next poll); Ok(Some): the data was wrong.
async fn verify(c: &Controller, nsid: u32, len: usize, seed: u64) -> Result<Option<String>> {
    let qid = 1 + (nsid % 2) as u16;
    if let Some(why) = read_check(c, qid, nsid, 0, &stamp::block(len, seed, nsid, BEFORE)).await? {
        return Ok(Some(format!("the block written before the fault: {why}")));
    }
    let b = stamp::block(len, seed, nsid, AFTER);
    c.write(qid, nsid, 1, 1, &b).await?;
    Ok(read_check(c, qid, nsid, 1, &b)
        .await?
        .map(|why| format!("the block written through the survivor: {why}")))
}

/// One line: how many, first/median/last, errors, the command, quiet.
pub(super) fn summary(r: &Value) -> String {
    let s = |k: &str| {
        r[k].as_f64()
            .map_or("-".into(), |v| format!("{:.3}", v / 1e3))
    };
    let mut l = format!(
        "failover-probe: {}: {}/{} volumes served elsewhere (ANA Optimized + verified write/read); \
         first {} s, median {} s, last {} s; verify errors {}",
        r["fault"].as_str().unwrap_or("?"),
        r["served"],
        r["volumes_n"],
        s("first_ms"),
        s("median_ms"),
        s("last_ms"),
        r["verify_errors"]
    );
    if let Some(run) = r["run"].as_object() {
        l += &format!(
            "; the command exited {} after {:.3} s",
            run["exit"],
            run["ms"].as_f64().unwrap_or(0.0) / 1e3
        );
    }
    if r["cpu"].is_object() {
        let c = &r["cpu"];
        l += &format!(
            "; CPU of the watched processes {:.2} s to the last volume, {:.2} s in the {} s after; quiet {}",
            c["to_last_s"].as_f64().unwrap_or(0.0),
            c["after_s"].as_f64().unwrap_or(0.0),
            c["after_window_s"],
            c["quiet_after_s"]
                .as_f64()
                .map_or("not within the window".into(), |q| format!(
                    "{q:.1} s after the last volume"
                ))
        );
    }
    l
}
