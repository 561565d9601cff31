use std::fs;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::super::tests::{CALICO, Env, OURS};
use super::*;

/// The repair deadline the spec asks for.
const REPAIR: Duration = Duration::from_secs(1);

struct Running {
    inst: Installer,
    stop: CancellationToken,
    task: JoinHandle<Result<(), InstallError>>,
}

impl Running {
    fn start(inst: &Installer) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(inst.clone().run(stop.clone()));
        Self { inst: inst.clone(), stop, task }
    }

    async fn until_ready(&self) {
        let inst = self.inst.clone();
        assert!(eventually(Duration::from_secs(5), move || inst.ready()).await, "never ready");
    }

    async fn finish(self) {
        self.stop.cancel();
        let done = tokio::time::timeout(Duration::from_secs(2), self.task).await;
        assert!(matches!(done, Ok(Ok(Ok(())))), "run did not end cleanly: {done:?}");
        assert!(!self.inst.ready());
    }
}

/// Polls `f` every 10 ms for up to `limit`.
async fn eventually(limit: Duration, f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Changes the installation, then checks it is valid again within [`REPAIR`].
async fn repaired_after(env: &Env, inst: &Installer, change: impl FnOnce(&Env)) {
    let repairs = inst.repairs();
    change(env);
    let start = Instant::now();
    let i = inst.clone();
    let ok = eventually(REPAIR, move || i.repairs() > repairs && i.validate().is_valid()).await;
    assert!(ok, "not repaired within {REPAIR:?}: {}", inst.validate());
    tracing::debug!(took = ?start.elapsed(), "repaired");
    let i = inst.clone();
    assert!(eventually(REPAIR, move || i.ready()).await, "not ready again");
}

#[tokio::test]
async fn repairs_a_removed_entry() {
    let env = Env::new();
    let path = env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    let run = Running::start(&inst);
    run.until_ready().await;
    assert_eq!(inst.repairs(), 0, "the first pass is no repair");
    repaired_after(&env, &inst, |_| fs::write(&path, CALICO).expect("rewrite")).await;
    assert!(env.read("10-calico.conflist").contains(OURS));
    run.finish().await;
}

#[tokio::test]
async fn repairs_a_deleted_binary() {
    let env = Env::new();
    env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    let run = Running::start(&inst);
    run.until_ready().await;
    let bin = env.bins[1].join(OURS);
    repaired_after(&env, &inst, |_| fs::remove_file(&bin).expect("rm")).await;
    assert!(bin.exists());
    // Changed in place, same size: still noticed (ctime) and repaired.
    let len = fs::metadata(&bin).expect("stat").len() as usize;
    repaired_after(&env, &inst, |_| fs::write(&bin, vec![b'x'; len]).expect("write")).await;
    run.finish().await;
}

#[tokio::test]
async fn repairs_a_file_replaced_without_us() {
    let env = Env::new();
    let path = env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    let run = Running::start(&inst);
    run.until_ready().await;
    repaired_after(&env, &inst, |env| {
        let tmp = env.path("calico.tmp");
        fs::write(&tmp, CALICO).expect("write");
        fs::rename(&tmp, &path).expect("rename");
    })
    .await;
    run.finish().await;
}

#[tokio::test]
async fn follows_a_new_higher_priority_config() {
    let env = Env::new();
    env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    let run = Running::start(&inst);
    run.until_ready().await;
    repaired_after(&env, &inst, |env| {
        env.write("05-cilium.conflist", r#"{"name":"c","plugins":[{"type":"cilium-cni"}]}"#);
    })
    .await;
    assert!(env.read("05-cilium.conflist").contains(OURS));
    run.finish().await;
}

#[tokio::test]
async fn waits_for_the_primary_config() {
    let env = Env::new();
    env.write("00-broken.conflist", "{");
    let inst = env.installer();
    let run = Running::start(&inst);
    let bins = env.bins.clone();
    assert!(eventually(Duration::from_secs(5), move || bins.iter().all(|b| b.join(OURS).exists())).await);
    tokio::time::sleep(3 * POLL).await;
    assert!(!inst.ready());
    assert_eq!(env.listing(), ["00-broken.conflist"], "no config without the primary");
    env.write("10-calico.conflist", CALICO);
    let i = inst.clone();
    assert!(eventually(REPAIR, move || i.ready()).await, "{}", inst.validate());
    assert!(env.read("10-calico.conflist").contains(OURS));
    assert_eq!(inst.repairs(), 0);
    run.finish().await;
}

#[tokio::test]
async fn a_failing_first_pass_ends_run() {
    let env = Env::new();
    env.write("10-bad.conflist", r#"{"name":"b"}"#);
    let mut cfg = env.config(true);
    cfg.conf_name = Some("10-bad.conflist".into());
    let inst = Installer::new(cfg).expect("installer");
    let done = tokio::time::timeout(Duration::from_secs(5), inst.run(CancellationToken::new())).await;
    let Ok(Err(err)) = done else {
        panic!("expected an error, got {done:?}");
    };
    assert!(err.to_string().contains("10-bad.conflist"), "{err}");
}

#[test]
fn throttle_lets_a_few_repairs_through_then_backs_off() {
    let mut t = Throttle::default();
    let start = Instant::now();
    let mut now = start;
    let mut delays = Vec::new();
    let mut warned = Vec::new();
    for _ in 0..8 {
        let (delay, warn) = t.repair(now);
        delays.push(delay.as_millis());
        warned.push(warn);
        now += delay + Duration::from_millis(100);
    }
    assert_eq!(delays, [0, 0, 0, 250, 500, 1000, 1000, 1000]);
    assert_eq!(warned, [false, false, false, false, false, true, false, false]);
    // Quiet for longer than the fight window: back to free repairs.
    let (delay, warn) = t.repair(now + Duration::from_secs(6));
    assert_eq!((delay, warn), (Duration::ZERO, false));
    // A long fight warns again after the warning interval.
    let mut now = now + Duration::from_secs(6);
    let mut warnings = 0;
    for _ in 0..40 {
        now += Duration::from_secs(1);
        if t.repair(now).1 {
            warnings += 1;
        }
    }
    assert_eq!(warnings, 2);
}
