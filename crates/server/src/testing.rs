//! Test scaffolding (compiled for tests, or with the `testing` feature; never in the product):
//! servers in one process, joined by a network that tests can aim at.
//!
//! [`TestCluster`] builds N servers — every part a real server has, no sockets — whose
//! requests to each other go through one [`Net`]. A test puts [`Filter`]s on the net in the
//! spirit of TiKV's `transport_simulate.rs`: *drop*, *delay*, *duplicate*, *hold* or deliver
//! *late* a given message type, to or from a given server, in a given direction (the request
//! or its answer), `n` times or while a flag is set. So a test can say "the second
//! `InstallEntry` to server s2 arrives after its caller gave up" and check what the
//! coordinators make of it. Every delivery runs on a thread of its own, as it would on the
//! receiving server.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ringfs_placement::{HashFunction, Scheme};
use ringfs_proto::{Credentials, Errno, Member, Request, Response};
use ringfs_rpc::{ConnectionConfig, Reply, Service};
use ringfs_store::ChunkStore;

use crate::ServerConfig;
use crate::dispatch::Dispatcher;
use crate::membership::Membership;
use crate::node::{LocalDispatch, Node};
use crate::outbound::{Outbound, OutboundCall};
use crate::session::Session;

/// Which way a filtered message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The request, from the caller to the server it is for.
    Request,
    /// The answer, back to the caller (the request was delivered and executed).
    Answer,
}

/// What a filter does to the messages it catches.
#[derive(Clone, Debug)]
pub enum Action {
    /// Lost: a request is never delivered; an answer is never received. The caller sees EIO.
    Drop,
    /// Delivered (or received) this much later; the caller waits for it until its deadline,
    /// then gets EIO (a delayed request is then not delivered).
    Delay(Duration),
    /// Delivered twice: the second copy when `release` is lowered (a copy held up in the
    /// network, arriving later).
    Duplicate { release: Arc<AtomicBool> },
    /// Held until `release` is lowered; the caller waits (or gives up at its deadline).
    Hold { release: Arc<AtomicBool> },
    /// The caller gives up at once (EIO), and the request is delivered when `release` is
    /// lowered: a request held up in the network past its caller's patience.
    Late { release: Arc<AtomicBool> },
    /// Answered with this error: a request is refused without being executed (its server
    /// found it could not be done); an answer is replaced (executed, then reported failed).
    Refuse(Errno),
}

/// Catches messages of one type (its `Request` variant's name, such as `"InstallEntry"`),
/// optionally only from or to one server, and acts on them.
#[derive(Clone, Debug)]
pub struct Filter {
    pub message: &'static str,
    pub from: Option<String>,
    pub to: Option<String>,
    pub direction: Direction,
    pub action: Action,
    /// Matches to let pass before acting ("the second one": skip 1).
    pub skip: usize,
    /// How many matches to act on after the skipped ones (`None`: all).
    pub times: Option<usize>,
    /// Acts only while this flag is raised (`None`: always).
    pub while_raised: Option<Arc<AtomicBool>>,
}

impl Filter {
    /// A filter acting on every request of type `message`.
    pub fn new(message: &'static str, action: Action) -> Filter {
        Filter { message, from: None, to: None, direction: Direction::Request, action, skip: 0, times: None, while_raised: None }
    }

    pub fn to(mut self, server: &str) -> Filter {
        self.to = Some(server.to_string());
        self
    }

    pub fn from(mut self, server: &str) -> Filter {
        self.from = Some(server.to_string());
        self
    }

    pub fn on_answer(mut self) -> Filter {
        self.direction = Direction::Answer;
        self
    }

    pub fn skip(mut self, count: usize) -> Filter {
        self.skip = count;
        self
    }

    pub fn times(mut self, count: usize) -> Filter {
        self.times = Some(count);
        self
    }

    pub fn while_raised(mut self, flag: Arc<AtomicBool>) -> Filter {
        self.while_raised = Some(flag);
        self
    }
}

/// A filter in the net, with how many messages it has matched.
struct Installed {
    filter: Filter,
    matched: AtomicUsize,
}

impl Installed {
    /// Whether this filter acts on a message of type `message` from `from` to `to` going
    /// `direction` (counting it as a match).
    fn catches(&self, message: &str, from: &str, to: &str, direction: Direction) -> bool {
        let filter = &self.filter;
        if filter.message != message
            || filter.direction != direction
            || filter.from.as_deref().is_some_and(|name| name != from)
            || filter.to.as_deref().is_some_and(|name| name != to)
            || filter.while_raised.as_ref().is_some_and(|flag| !flag.load(Ordering::SeqCst))
        {
            return false;
        }
        let seen = self.matched.fetch_add(1, Ordering::SeqCst);
        seen >= filter.skip && filter.times.is_none_or(|times| seen < filter.skip + times)
    }
}

/// The name of a request's type, as filters name it (`"InstallEntry"`).
pub fn message_type(request: &Request) -> String {
    let debug = format!("{request:?}");
    debug.split(['(', ' ', '{']).next().unwrap_or_default().to_string()
}

/// A message the net delivered (for tests that check what went where).
#[derive(Clone, Debug)]
pub struct Delivery {
    pub message: String,
    pub from: String,
    pub to: String,
}

/// The network between the servers of a [`TestCluster`].
#[derive(Default)]
pub struct Net {
    servers: RwLock<HashMap<String, Weak<Dispatcher>>>,
    filters: Mutex<Vec<Arc<Installed>>>,
    deliveries: Mutex<Vec<Delivery>>,
    /// Threads delivering late copies, joined by [`Net::settle`].
    late: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// When set, every delivery is a step of this schedule (see [`Schedule`]).
    schedule: RwLock<Option<Arc<Schedule>>>,
}

impl Net {
    /// Puts a filter on the net (it acts on messages sent from now on).
    pub fn add(&self, filter: Filter) {
        self.filters.lock().push(Arc::new(Installed { filter, matched: AtomicUsize::new(0) }));
    }

    /// Runs every delivery from now on as a step of `schedule`.
    pub fn set_schedule(&self, schedule: Arc<Schedule>) {
        *self.schedule.write() = Some(schedule);
    }

    /// Delivers on threads of their own again (after a scheduled run: a thread that is not a
    /// step of the schedule must not start steps, or the order would depend on it).
    pub fn clear_schedule(&self) {
        *self.schedule.write() = None;
    }

    fn schedule(&self) -> Option<Arc<Schedule>> {
        self.schedule.read().clone()
    }

    /// Takes every filter off the net.
    pub fn clear(&self) {
        self.filters.lock().clear();
    }

    /// How many messages of type `message` the installed filters caught so far.
    pub fn caught(&self, message: &str) -> usize {
        self.filters
            .lock()
            .iter()
            .filter(|installed| installed.filter.message == message)
            .map(|installed| installed.matched.load(Ordering::SeqCst))
            .sum()
    }

    /// The messages delivered so far of type `message`.
    pub fn delivered(&self, message: &str) -> Vec<Delivery> {
        self.deliveries.lock().iter().filter(|delivery| delivery.message == message).cloned().collect()
    }

    /// Waits until every late or duplicated copy released so far has been delivered.
    pub fn settle(&self) {
        let threads = std::mem::take(&mut *self.late.lock());
        for thread in threads {
            let _ = thread.join();
        }
    }

    fn action(&self, message: &str, from: &str, to: &str, direction: Direction) -> Option<Action> {
        let filters = self.filters.lock().clone();
        filters.iter().find(|installed| installed.catches(message, from, to, direction)).map(|installed| installed.filter.action.clone())
    }

    /// Runs `request` at server `to` as a request from server `from` would run there.
    fn deliver(&self, from: &str, to: &str, request: &Request, data: &[u8]) -> Result<Reply, Errno> {
        let server = self.servers.read().get(to).and_then(Weak::upgrade).ok_or(Errno::EIO)?;
        self.deliveries.lock().push(Delivery { message: message_type(request), from: from.to_string(), to: to.to_string() });
        let mut session = Session::local();
        let mut reply_data = Vec::new();
        let response = server.handle(&mut session, request.clone(), data, &mut reply_data);
        match response {
            Response::Error(errno) => Err(errno),
            response => {
                let data_len = reply_data.len();
                Ok(Reply { response, data: reply_data, data_len })
            }
        }
    }

    /// Delivers a copy of `request` in the background once `release` is lowered.
    fn deliver_when_released(self: &Arc<Self>, release: Arc<AtomicBool>, from: &str, to: &str, request: &Request, data: &[u8]) {
        let (net, from, to, request, data) = (self.clone(), from.to_string(), to.to_string(), request.clone(), data.to_vec());
        let body = move || {
            wait_lowered(&release, None);
            let _ = net.deliver(&from, &to, &request, &data);
        };
        let thread = match self.schedule() {
            Some(schedule) => schedule.spawn(body),
            None => std::thread::spawn(body),
        };
        self.late.lock().push(thread);
    }

    /// One call through the filters, from `from`, answered until `until`.
    fn call(self: &Arc<Self>, from: &str, call: OutboundCall<'_>, until: Option<Instant>) -> Result<Reply, Errno> {
        let message = message_type(call.request);
        let to = call.to.name.as_str();
        match self.action(&message, from, to, Direction::Request) {
            Some(Action::Drop) => return Err(Errno::EIO),
            Some(Action::Delay(delay)) if !sleep_within(delay, until) => return Err(Errno::EIO),
            Some(Action::Hold { release }) if !wait_lowered(&release, until) => return Err(Errno::EIO),
            Some(Action::Late { release }) => {
                self.deliver_when_released(release, from, to, call.request, call.data);
                return Err(Errno::EIO);
            }
            Some(Action::Duplicate { release }) => self.deliver_when_released(release, from, to, call.request, call.data),
            Some(Action::Refuse(errno)) => return Err(errno),
            Some(Action::Delay(_) | Action::Hold { .. }) | None => {}
        }
        let answer = self.deliver(from, to, call.request, call.data);
        match self.action(&message, from, to, Direction::Answer) {
            Some(Action::Drop | Action::Late { .. }) => Err(Errno::EIO),
            Some(Action::Delay(delay)) if !sleep_within(delay, until) => Err(Errno::EIO),
            Some(Action::Hold { release } | Action::Duplicate { release }) => {
                if wait_lowered(&release, until) {
                    answer
                } else {
                    Err(Errno::EIO)
                }
            }
            Some(Action::Refuse(errno)) => Err(errno),
            Some(Action::Delay(_)) | None => answer,
        }
    }
}

/// Sleeps for `delay`, or until `until` if that comes first (false: the caller gave up).
fn sleep_within(delay: Duration, until: Option<Instant>) -> bool {
    let patience = until.map_or(delay, |until| until.saturating_duration_since(crate::sched::now()));
    std::thread::sleep(delay.min(patience));
    delay <= patience
}

/// Waits until `flag` is lowered (true), or `until` passes (false).
fn wait_lowered(flag: &AtomicBool, until: Option<Instant>) -> bool {
    while flag.load(Ordering::SeqCst) {
        if until.is_some_and(|until| crate::sched::now() >= until) {
            return false;
        }
        crate::sched::pause(Duration::from_millis(1));
    }
    true
}

/// Where a scheduled call's answer is put by the step that delivers it.
type AnswerSlot = Arc<Mutex<Option<Result<Reply, Errno>>>>;

/// One server's way out onto the [`Net`].
struct Port {
    net: Arc<Net>,
    from: String,
}

impl Outbound for Port {
    fn call_each(&self, calls: &[OutboundCall<'_>], until: Option<Instant>, meanwhile: &mut dyn FnMut()) -> Vec<Result<Reply, Errno>> {
        if let Some(schedule) = self.net.schedule() {
            return self.call_each_scheduled(&schedule, calls, until, meanwhile);
        }
        std::thread::scope(|scope| {
            let pending: Vec<_> = calls.iter().map(|call| scope.spawn(|| self.net.call(&self.from, *call, until))).collect();
            meanwhile();
            pending.into_iter().map(|thread| thread.join().unwrap_or(Err(Errno::EIO))).collect()
        })
    }

    fn call_rank(&self, _endpoint: &str, _request: &Request, _data: &[u8]) -> Result<Reply, Errno> {
        // No global-memory ranks in an in-process cluster.
        Err(Errno::EIO)
    }

    fn ping(&self, member: &Member, timeout: Duration) -> bool {
        let call = OutboundCall { to: member, request: &Request::Ping, data: &[] };
        self.net.call(&self.from, call, Some(crate::sched::now() + timeout)).is_ok()
    }
}

impl Port {
    /// [`Outbound::call_each`] under a [`Schedule`]: every call is a step of its own; the
    /// caller gives its turn away while it waits for them.
    fn call_each_scheduled(
        &self,
        schedule: &Arc<Schedule>,
        calls: &[OutboundCall<'_>],
        until: Option<Instant>,
        meanwhile: &mut dyn FnMut(),
    ) -> Vec<Result<Reply, Errno>> {
        crate::sched::yield_point();
        let answers: Vec<AnswerSlot> = calls.iter().map(|_| Arc::new(Mutex::new(None))).collect();
        for (call, answer) in calls.iter().zip(&answers) {
            let (net, from, answer) = (self.net.clone(), self.from.clone(), answer.clone());
            let (to, request, data) = (call.to.clone(), call.request.clone(), call.data.to_vec());
            let label = format!("{} {from}->{}", message_type(&request), to.name);
            schedule.spawn_labelled(label, move || {
                let outcome = net.call(&from, OutboundCall { to: &to, request: &request, data: &data }, until);
                *answer.lock() = Some(outcome);
            });
        }
        meanwhile();
        answers
            .iter()
            .map(|answer| {
                loop {
                    if let Some(outcome) = answer.lock().take() {
                        break outcome;
                    }
                    crate::sched::yield_point();
                }
            })
            .collect()
    }
}

/// Runs the steps of a cluster one at a time, in an order a seed decides, so that a seed
/// replays an interleaving: a *step* is a thread the schedule started (a client's operations,
/// one delivery of a message), and it runs alone until it waits, sends a message or ends
/// (`sched`); then the schedule picks, with its seeded generator, which waiting step goes
/// next. A step that blocks where the schedule cannot see it (a lock held across a step,
/// which the servers' design avoids) is noticed by a watchdog after [`STALL_LIMIT`], counted
/// as a stall, and another step is let go; a run without stalls is replayed exactly by its
/// seed (the order of steps: [`Schedule::trace`]).
pub struct Schedule {
    state: Mutex<ScheduleState>,
    turn: parking_lot::Condvar,
    /// Where the schedule's clock starts (see [`Schedule::now`]).
    epoch: Instant,
}

/// How far the schedule's clock advances per turn given: the time a step takes on a quiet
/// machine, about.
pub const TURN_TIME: Duration = Duration::from_micros(250);

/// A step that keeps the turn this long without giving it back is taken to be blocked.
pub const STALL_LIMIT: Duration = Duration::from_millis(500);

struct ScheduleState {
    random: u64,
    started: bool,
    running: Option<u64>,
    /// Steps waiting for their turn, by number (numbers are given in the order steps are
    /// started, which the schedule itself decides).
    ready: std::collections::BTreeSet<u64>,
    next_step: u64,
    /// Every turn given, in order.
    trace: Vec<u64>,
    /// What each step is (for a reader of a trace), by step number.
    labels: std::collections::BTreeMap<u64, String>,
    stalls: u64,
    live: usize,
}

/// A step's view of its schedule (what `sched` calls).
struct StepTurns {
    schedule: Arc<Schedule>,
    step: u64,
}

impl crate::sched::Turns for StepTurns {
    fn yield_turn(&self) {
        self.schedule.yield_turn(self.step);
    }

    fn now(&self) -> Instant {
        self.schedule.now()
    }
}

impl Schedule {
    /// A schedule whose order of steps `seed` decides. Steps started before
    /// [`Schedule::start`] wait for it.
    pub fn new(seed: u64) -> Arc<Schedule> {
        let schedule = Arc::new(Schedule {
            state: Mutex::new(ScheduleState {
                random: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                started: false,
                running: None,
                ready: Default::default(),
                next_step: 0,
                trace: Vec::new(),
                labels: Default::default(),
                stalls: 0,
                live: 0,
            }),
            turn: parking_lot::Condvar::new(),
            epoch: Instant::now(),
        });
        let watched = Arc::downgrade(&schedule);
        std::thread::spawn(move || watch_for_stalls(&watched));
        schedule
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, ScheduleState> {
        self.state.lock()
    }

    /// Starts `body` as a step (it runs when the schedule gives it the turn).
    pub fn spawn(self: &Arc<Self>, body: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
        self.spawn_labelled(String::new(), body)
    }

    /// [`Schedule::spawn`] of a step that `label` describes.
    pub fn spawn_labelled(self: &Arc<Self>, label: String, body: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
        // Ready at once (not when its thread gets going): which steps a turn can go to must
        // not depend on how fast the system starts threads.
        let step = {
            let mut state = self.state();
            state.next_step += 1;
            state.live += 1;
            let step = state.next_step;
            state.ready.insert(step);
            state.labels.insert(step, label);
            step
        };
        let schedule = self.clone();
        std::thread::spawn(move || {
            schedule.await_turn(step);
            crate::sched::with_turns(Arc::new(StepTurns { schedule: schedule.clone(), step }), body);
            let mut state = schedule.state();
            state.live -= 1;
            if state.running == Some(step) {
                schedule.pick(&mut state);
            }
        })
    }

    /// Lets the steps run (once every first step has been started).
    pub fn start(&self) {
        let mut state = self.state();
        state.started = true;
        if state.running.is_none() {
            self.pick(&mut state);
        }
    }

    /// The schedule's clock: [`TURN_TIME`] per turn given so far. Its steps go by it (see
    /// `sched::now`), so a deadline, a lease or a cached answer runs out at the same turn in
    /// every run of a seed, however slow the machine.
    pub fn now(&self) -> Instant {
        self.epoch + TURN_TIME * self.state().trace.len() as u32
    }

    /// The order in which steps had their turns.
    pub fn trace(&self) -> Vec<u64> {
        self.state().trace.clone()
    }

    /// What step `step` is.
    pub fn label(&self, step: u64) -> String {
        self.state().labels.get(&step).cloned().unwrap_or_default()
    }

    /// How many times a step kept its turn past [`STALL_LIMIT`].
    pub fn stalls(&self) -> u64 {
        self.state().stalls
    }

    /// Gives the turn to a waiting step chosen by the seed (or to nobody).
    fn pick(&self, state: &mut ScheduleState) {
        state.running = None;
        if !state.started || state.ready.is_empty() {
            return;
        }
        state.random ^= state.random << 13;
        state.random ^= state.random >> 7;
        state.random ^= state.random << 17;
        let index = (state.random % state.ready.len() as u64) as usize;
        let step = *state.ready.iter().nth(index).expect("index within the ready steps");
        state.ready.remove(&step);
        state.running = Some(step);
        state.trace.push(step);
        self.turn.notify_all();
    }

    /// Waits until `step` (ready) has the turn.
    fn await_turn(&self, step: u64) {
        let mut state = self.state();
        if state.running.is_none() {
            self.pick(&mut state);
        }
        while state.running != Some(step) {
            self.turn.wait(&mut state);
        }
    }

    fn yield_turn(&self, step: u64) {
        {
            let mut state = self.state();
            state.ready.insert(step);
            if state.running == Some(step) {
                self.pick(&mut state);
            }
        }
        self.await_turn(step);
    }
}

/// Lets another step go when the running one keeps its turn past [`STALL_LIMIT`].
fn watch_for_stalls(schedule: &Weak<Schedule>) {
    let mut last = (None, 0);
    let mut since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let Some(schedule) = schedule.upgrade() else { return };
        let mut state = schedule.state();
        let now = (state.running, state.trace.len());
        if now != last || state.running.is_none() {
            (last, since) = (now, Instant::now());
            continue;
        }
        if since.elapsed() >= STALL_LIMIT {
            state.stalls += 1;
            schedule.pick(&mut state);
            since = Instant::now();
        }
    }
}

/// A server of a [`TestCluster`].
pub struct TestServer {
    pub node: Arc<Node>,
    pub dispatcher: Arc<Dispatcher>,
}

/// N servers in this process (memory stores) on one [`Net`].
pub struct TestCluster {
    pub net: Arc<Net>,
    pub servers: Vec<TestServer>,
}

impl TestCluster {
    /// Servers `s0`, `s1`, … with memory stores and default settings.
    pub fn new(count: usize) -> TestCluster {
        TestCluster::with_config(count, |_| {})
    }

    /// Like [`TestCluster::new`], with each server's configuration adjusted by `adjust`.
    pub fn with_config(count: usize, adjust: impl Fn(&mut ServerConfig)) -> TestCluster {
        let net = Arc::new(Net::default());
        let members: Vec<Member> = (0..count)
            .map(|index| Member {
                name: format!("s{index}"),
                tcp_address: format!("in-process:s{index}"),
                unix_path: String::new(),
                host_id: index as u64 + 1,
                pid: 0,
                alive: true,
                incarnation: 1,
            })
            .collect();
        let servers = members
            .iter()
            .map(|own| {
                let mut config = ServerConfig::new(&own.name, "127.0.0.1:0", b"test".to_vec());
                adjust(&mut config);
                let mut membership = Membership::new(own.clone(), HashFunction::default(), Scheme::default());
                for other in members.iter().filter(|other| other.name != own.name) {
                    membership.admit(other.clone());
                }
                let store = ChunkStore::open(config.store.clone()).expect("a test store opens");
                let port = Arc::new(Port { net: net.clone(), from: own.name.clone() });
                let (gossip, _) = std::sync::mpsc::channel();
                let connection = ConnectionConfig {
                    secret: config.secret.clone(),
                    timeout: config.peer_timeout,
                    host_id: own.host_id,
                    from_server: true,
                    poll: Duration::ZERO,
                    client_id: 0,
                    credentials: Default::default(),
                };
                let node = Arc::new(Node::new(own.name.clone(), store, membership, port, connection, gossip));
                let dispatcher = Arc::new(Dispatcher::build(&node, &config));
                node.set_local_dispatch(Arc::downgrade(&dispatcher) as Weak<dyn LocalDispatch>);
                net.servers.write().insert(own.name.clone(), Arc::downgrade(&dispatcher));
                TestServer { node, dispatcher }
            })
            .collect();
        TestCluster { net, servers }
    }

    /// The index of the server named `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.servers.iter().position(|server| server.node.name == name).expect("a server of this cluster")
    }

    /// The name of the server that holds the entry of `path`.
    pub fn owner_of(&self, path: &str) -> String {
        self.servers[0].node.owner_of_path(path).name
    }

    /// A path `{prefix}{n}` whose entry is held by server `server` (`n` counts up from 0).
    pub fn path_on(&self, prefix: &str, server: &str) -> String {
        (0..10_000).map(|n| format!("{prefix}{n}")).find(|path| self.owner_of(path) == server).expect("a name on every server")
    }

    /// Sends `request` as a root client would, to the server that owns its key (any other
    /// forwards it), with a client's patience of `patience`.
    pub fn client_call(&self, request: Request, patience: Duration) -> Result<Response, Errno> {
        self.client_call_with_data(request, &[], patience)
    }

    /// [`TestCluster::client_call`] of a request with a data section (an inline write).
    pub fn client_call_with_data(&self, request: Request, data: &[u8], patience: Duration) -> Result<Response, Errno> {
        let entry = match request.route() {
            ringfs_proto::Route::Path(path) => self.index_of(&self.owner_of(path)),
            ringfs_proto::Route::Chunk(key) => self.index_of(&self.servers[0].node.owner_of_chunk(key).name),
            ringfs_proto::Route::Here => 0,
        };
        let mut session = Session::default();
        session.credentials = Some(Arc::new(Credentials::root()));
        session.patience = Some(patience);
        let mut reply_data = Vec::new();
        match self.servers[entry].dispatcher.handle(&mut session, request, data, &mut reply_data) {
            Response::Error(errno) => Err(errno),
            response => Ok(response),
        }
    }

    /// Asks every server to flush what is dirty now to the backend (cache mode), as
    /// `ringfs sync` does; the first error, if any.
    pub fn sync(&self) -> Result<(), Errno> {
        for server in &self.servers {
            let mut ticket = 0;
            loop {
                let mut session = Session::local();
                match server.dispatcher.handle(&mut session, Request::Sync(ringfs_proto::Sync { ticket }), &[], &mut Vec::new()) {
                    Response::SyncProgress(progress) if progress.remaining == 0 => break,
                    Response::SyncProgress(progress) => ticket = progress.ticket,
                    Response::Error(errno) => return Err(errno),
                    other => panic!("sync answered {other:?}"),
                }
            }
        }
        Ok(())
    }

    /// [`TestCluster::client_call`] with a patience of 10 s.
    pub fn call(&self, request: Request) -> Result<Response, Errno> {
        self.client_call(request, Duration::from_secs(10))
    }
}
