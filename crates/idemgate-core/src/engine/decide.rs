//! Deciding a call: naming its record, reserving it, and judging a record that stands (a
//! replay, a wait for a call in flight, an unknown outcome taken over or verified, an expired
//! one) until the call may run or has its answer.

use super::*;

impl<S: Store> Engine<S> {
    /// The decision of [`Engine::begin`], before the observers hear of it.
    pub(super) async fn decide(
        &self,
        call: Call,
        policy: &ToolPolicy,
    ) -> Result<Begun, EngineError> {
        if !policy.mode.is_enforce() {
            // Behind `dyn`: its type nests the slow path's once more, and the auto traits of
            // every future a door builds over `begin` are proven through it.
            let observed: Pin<Box<dyn Future<Output = _> + Send + '_>> =
                Box::pin(self.decide_observed(call, policy));
            return observed.await;
        }
        // A call the window names is compared by what names its action.
        let fingerprint = call.window_arguments();
        let scope = call.scope.clone();
        let Some(Named { key, rule, keep }) = name(call, policy)? else {
            return Ok(Begun::PassThrough);
        };
        if let Some(done) = self.replays.get(&key, self.clock.now()) {
            if done.fingerprint != fingerprint {
                return Err(EngineError::KeyReuse {
                    key,
                    rule,
                    first_seen: done.created_at,
                });
            }
            replay_span(done.completed_at);
            return Ok(Begun::Answered(Answer {
                key: Some(key),
                rule: Some(rule),
                decision: done.into_replay(false),
            }));
        }
        // The key moves into the reservation and from there into the ticket or the answer: a
        // call clones no name on its way through the engine.
        let reservation = Reservation::new(key, fingerprint, policy.lease).with_scope(scope);
        match self.store.reserve(&reservation).await {
            Ok(Claim::Acquired(lease)) => Ok(executing(reservation, rule, keep, lease)),
            // A replay, the other common case, also answers without the slow path.
            Ok(Claim::Existing(record))
                if record.fingerprint == fingerprint
                    && matches!(record.state, RecordState::Completed { .. }) =>
            {
                let decision = self.replay(&reservation.key, record);
                Ok(answered(reservation, rule, decision))
            }
            // Waits, unknown records, key reuse and store errors: boxed, so that the common
            // call's future stays small (all of it is copied on every call).
            first => Box::pin(self.judge(reservation, rule, keep, policy, first)).await,
        }
    }

    /// Tells the observers what `begin` decided.
    pub(super) fn observe_begun(
        &self,
        tenant: &TenantId,
        tool: &ToolName,
        begun: &Result<Begun, EngineError>,
    ) {
        let (key, verdict, fence, answer, error) = match begun {
            Ok(Begun::Execute(t)) => (
                Some(&t.key),
                Verdict::Execute,
                Some(t.lease.fence),
                None,
                None,
            ),
            Ok(Begun::PassThrough | Begun::Observed { .. }) => {
                (None, Verdict::PassedThrough, None, None, None)
            }
            Ok(Begun::Answered(a)) => (a.key.as_ref(), Verdict::of_answer(a), None, Some(a), None),
            Err(e) => {
                let key = match e {
                    EngineError::KeyReuse { key, .. } => Some(key),
                    _ => None,
                };
                (key, Verdict::of_error(e), None, None, Some(e))
            }
        };
        self.observers.observe(&Event::Call {
            tenant,
            tool,
            key,
            verdict,
            fence,
            answer,
            error,
        });
    }

    /// The replay of a completed record (remembered for the next duplicate).
    pub(super) fn replay(&self, key: &Key, record: Record) -> Decision {
        let RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            ..
        } = record.state
        else {
            unreachable!("only completed records are replayed")
        };
        replay_span(completed_at);
        let done = Completed {
            fingerprint: record.fingerprint,
            created_at: record.created_at,
            outcome,
            completed_at,
            expires_at,
        };
        self.replays.put(key, done.clone());
        done.into_replay(false)
    }

    /// The slow path of [`Engine::begin`]: judges an existing record (or a failed reservation),
    /// waiting, taking over or verifying as the policy says, and reserving again when the record
    /// goes away meanwhile.
    pub(super) async fn judge(
        &self,
        reservation: Reservation,
        rule: KeyRule,
        keep: Keep,
        policy: &ToolPolicy,
        first: Result<Claim, StoreError>,
    ) -> Result<Begun, EngineError> {
        let answer = |r: Reservation, decision| answered(r, rule, decision);
        let ticket = |r: Reservation, lease| executing(r, rule, keep, lease);
        let mut first = Some(first);
        // Only a waiting duplicate needs the clock; a fresh call or a replay does not read it.
        let mut deadline = None;
        loop {
            let reserved = match first.take() {
                Some(claim) => claim,
                None => self.store.reserve(&reservation).await,
            };
            let claim = match reserved {
                Ok(claim) => claim,
                Err(e) => {
                    // Unavailable: nothing reached the store, so nothing can have landed.
                    if !matches!(e, StoreError::Unavailable(_)) {
                        let budget = self.settings.abandon_budget;
                        let taken_back =
                            tokio::time::timeout(budget, self.abandon_reservation(&reservation))
                                .await
                                .unwrap_or(false);
                        if !taken_back {
                            self.journal_take_back(&reservation).await;
                        }
                    }
                    return Err(EngineError::ReserveFailed(e));
                }
            };
            let record = match claim {
                Claim::Acquired(lease) => return Ok(ticket(reservation, lease)),
                Claim::Existing(record) => record,
            };
            if record.fingerprint != reservation.fingerprint {
                return Err(EngineError::KeyReuse {
                    key: reservation.key,
                    rule,
                    first_seen: record.created_at,
                });
            }
            match record.state {
                RecordState::Completed { .. } => {
                    let decision = self.replay(&reservation.key, record);
                    return Ok(answer(reservation, decision));
                }
                // The action ran and its outcome is no longer kept: never run again silently.
                RecordState::Expired {
                    completed_at,
                    expired_at,
                    retain_until,
                } => {
                    let decision = Decision::Expired {
                        executed_at: completed_at,
                        expired_at,
                        retain_until,
                        fence: record.fence,
                    };
                    return Ok(answer(reservation, decision));
                }
                RecordState::InFlight { lease_until } => {
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + policy.wait);
                    let waiting = self
                        .wait_while_in_flight(&reservation.key, deadline)
                        .instrument(tracing::info_span!(target: TRACE_TARGET, "idemgate.wait"));
                    match Box::pin(waiting).await? {
                        Waited::Left(seen) => first = seen.map(|r| Ok(Claim::Existing(r))),
                        Waited::TimedOut => {
                            let retry_after = retry_after(self.clock.now().until(lease_until));
                            return Ok(answer(
                                reservation,
                                Decision::InFlight {
                                    since: record.created_at,
                                    retry_after,
                                },
                            ));
                        }
                    }
                }
                RecordState::Unknown { since } => {
                    if let Some(left) = self.unknown_settle_left(&reservation.key) {
                        // The holder may still flush an outcome it journaled while the store was
                        // out of reach: watch the record a little before judging it.
                        let until = Instant::now() + left;
                        let still_unknown =
                            |s: &RecordState| matches!(s, RecordState::Unknown { .. });
                        if let Waited::Left(seen) =
                            Box::pin(self.wait_while(&reservation.key, until, still_unknown))
                                .await?
                        {
                            first = seen.map(|r| Ok(Claim::Existing(r)));
                            continue;
                        }
                    }
                    let found = |message| Decision::Unknown {
                        since,
                        fence: record.fence,
                        ran_here: false,
                        message,
                        recording: None,
                    };
                    let verifier = match policy.on_unknown {
                        UnknownPolicy::Block => {
                            let why =
                                Box::pin(self.why_unknown(&reservation.key, record.fence)).await;
                            return Ok(answer(reservation, found(why)));
                        }
                        UnknownPolicy::Retry => None,
                        UnknownPolicy::Verify => {
                            match self.verifiers.get(reservation.key.tool.as_str()) {
                                Some(v) => Some(v),
                                None => {
                                    let message = format!(
                                        "tool {} has unknown policy verify but no verifier is registered",
                                        reservation.key.tool
                                    );
                                    return Ok(answer(reservation, found(Some(message))));
                                }
                            }
                        }
                    };
                    // Somebody else changed the record first: look again.
                    let Some(lease) = Box::pin(self.take_over(&reservation, record.fence)).await?
                    else {
                        continue;
                    };
                    return match verifier {
                        None => {
                            let entry = HistoryEntry::new(
                                self.clock.now(),
                                record.fence,
                                Happening::RetriedAfterUnknown,
                                None,
                                Some(&format!(
                                    "unknown since {since}; the tool's on_unknown = retry ran the \
                                     action again at fence {}",
                                    lease.fence
                                )),
                            );
                            Box::pin(self.note(&reservation.key, entry)).await;
                            Ok(ticket(reservation, lease))
                        }
                        Some(v) => {
                            Box::pin(self.verify(&**v, reservation, rule, keep, lease, since)).await
                        }
                    };
                }
            }
        }
    }

    /// Why the record of `key` at `fence` is unknown, as its history says (the reason the call
    /// that ran it gave), for a duplicate's answer; `None` when it says nothing or cannot be read
    /// (the answer then names the likely causes).
    async fn why_unknown(&self, key: &Key, fence: Fence) -> Option<String> {
        let history = self.store.history(key).await.ok()?;
        let entry = crate::history::became_unknown_at(&history, fence)?;
        Some(match &entry.reason {
            Some(reason) => format!("the call that ran it reported: {reason}"),
            None => "the call that ran it reported that it could not tell whether it took effect"
                .to_owned(),
        })
    }

    /// Asks `verifier` about a record this call took over from unknown (holding `lease`): runs the
    /// call if it did not happen, stores and replays the outcome if it did, and marks the record
    /// unknown again if the verifier cannot tell.
    pub(super) async fn verify(
        &self,
        verifier: &dyn Verifier,
        reservation: Reservation,
        rule: KeyRule,
        keep: Keep,
        lease: Lease,
        since: Timestamp,
    ) -> Result<Begun, EngineError> {
        let probe = verifier.verify(&reservation.key).await;
        let found = match &probe {
            Ok(Probe::NotApplied) => Some(
                "the verifier found that the action did not happen downstream: the call runs it",
            ),
            Ok(Probe::Applied(_)) => Some(
                "the verifier found that the action happened downstream: its outcome is stored",
            ),
            Ok(Probe::Unknown) | Err(_) => None,
        };
        if let Some(found) = found {
            let entry = HistoryEntry::new(
                self.clock.now(),
                lease.fence,
                Happening::Verified,
                None,
                Some(found),
            );
            self.note(&reservation.key, entry).await;
        }
        let decision = match probe {
            Ok(Probe::NotApplied) => return Ok(executing(reservation, rule, keep, lease)),
            Ok(Probe::Applied(outcome)) => {
                let op = JournalOp::complete(outcome, keep);
                let (done, _) = self
                    .record(&reservation.key, lease, &op, Some(reservation.fingerprint))
                    .await;
                let JournalOp::Complete { outcome, .. } = op else {
                    unreachable!("built as a completion above")
                };
                let done = done.unwrap_or_else(|| self.local_completion(keep.ttl));
                Decision::Replayed {
                    outcome,
                    executed_at: done.completed_at,
                    expires_at: done.expires_at,
                    verified: true,
                }
            }
            Ok(Probe::Unknown) | Err(_) => {
                let (marked, recording) = self.mark_unknown(&reservation.key, lease).await;
                let message = match probe {
                    Err(e) => format!("verifier failed: {e}"),
                    _ => "verifier could not tell".to_owned(),
                };
                if recording == Recording::Stored {
                    let entry = HistoryEntry::new(
                        self.clock.now(),
                        lease.fence,
                        Happening::BecameUnknown,
                        None,
                        Some(&message),
                    );
                    self.note(&reservation.key, entry).await;
                }
                // The takeover raised the fence: an operator resolves the record at the new one.
                Decision::Unknown {
                    since: marked.unwrap_or(since),
                    fence: lease.fence,
                    ran_here: false,
                    message: Some(message),
                    recording: Some(recording),
                }
            }
        };
        Ok(answered(reservation, rule, decision))
    }

    /// After a failed reservation, makes sure no reservation of ours is left behind to turn into a
    /// false "unknown": the reservation is retried with the same token (which finds our own record
    /// if the first attempt did land) and, if it is ours, released. Best effort and bounded;
    /// whether the store answered that nothing of ours is left.
    pub(super) async fn abandon_reservation(&self, r: &Reservation) -> bool {
        for _ in 0..2 {
            match self.store.reserve(r).await {
                Ok(Claim::Acquired(lease)) => {
                    if self.store.release(&r.key, lease).await.is_ok() {
                        return true;
                    }
                }
                Ok(Claim::Existing(_)) => return true,
                Err(_) => {}
            }
            tokio::time::sleep(self.settings.finish_backoff).await;
        }
        false
    }

    /// A reservation that may have landed and could not be taken back (the store went away):
    /// journaled, so that the flush takes it back once the store is back ([`JournalOp::TakeBack`]).
    /// Without a journal that can take it, the record ends unknown when its lease does, for an
    /// operator, as before: never run, never run twice.
    async fn journal_take_back(&self, r: &Reservation) {
        let entry = JournalEntry {
            key: r.key.clone(),
            lease: Lease {
                fence: 0,
                token: r.token,
            },
            op: JournalOp::TakeBack,
            journaled_at: self.clock.now(),
            fingerprint: Some(r.fingerprint),
        };
        // Best effort: a journal that cannot take it leaves the record to end unknown.
        let _ = self.append_to_journal(entry).await;
    }

    /// Takes an unknown record over. `None` when somebody else changed it first (look again).
    pub(super) async fn take_over(
        &self,
        r: &Reservation,
        stale: Fence,
    ) -> Result<Option<Lease>, EngineError> {
        match self.store.takeover(r, stale).await {
            Ok(Claim::Acquired(lease)) => Ok(Some(lease)),
            Ok(Claim::Existing(_)) => Ok(None),
            Err(e) => {
                // The takeover may have landed: put the record back to unknown, never to absent.
                let lease = Lease {
                    fence: stale + 1,
                    token: r.token,
                };
                let _ = self.store.mark_unknown(&r.key, lease).await;
                Err(EngineError::ReserveFailed(e))
            }
        }
    }

    /// Waits until the record is no longer in flight or the deadline passed.
    pub(super) async fn wait_while_in_flight(
        &self,
        key: &Key,
        deadline: Instant,
    ) -> Result<Waited, EngineError> {
        self.wait_while(key, deadline, |s| matches!(s, RecordState::InFlight { .. }))
            .await
    }

    /// Waits until the record's state no longer satisfies `still` or the deadline passed.
    pub(super) async fn wait_while(
        &self,
        key: &Key,
        deadline: Instant,
        still: impl Fn(&RecordState) -> bool,
    ) -> Result<Waited, EngineError> {
        // Looks before each wait, the first included, and takes the change mark before each
        // look: a change that lands between the look and the wait has moved the mark on, so the
        // wait ends at once instead of sleeping a whole slice past it.
        loop {
            let mark = self.store.change_mark(key);
            match self.store.get(key).await? {
                Some(Record { state, .. }) if still(&state) => {}
                seen => return Ok(Waited::Left(seen)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Waited::TimedOut);
            }
            let slice = (deadline - now).min(self.settings.max_poll);
            self.store.wait_changed(key, mark, slice).await;
        }
    }

    /// How much longer a call must watch an unknown record before judging it: the rest of the
    /// settle window since this engine first found it unknown; `None` once that has passed.
    pub(super) fn unknown_settle_left(&self, key: &Key) -> Option<Duration> {
        let settle = self.settings.unknown_settle;
        if settle.is_zero() {
            return None;
        }
        let now = Instant::now();
        let mut seen = self.unknown_seen.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: entries past their window only spare a later call the wait; drop them first.
        if seen.len() >= UNKNOWN_SEEN_MAX {
            seen.retain(|_, first| now.duration_since(*first) < settle);
            if seen.len() >= UNKNOWN_SEEN_MAX {
                seen.clear();
            }
        }
        let first = *seen.entry(key.clone()).or_insert(now);
        settle
            .checked_sub(now.duration_since(first))
            .filter(|d| !d.is_zero())
    }
}

/// Most records an engine remembers having found unknown (see [`Settings::unknown_settle`]).
pub(super) const UNKNOWN_SEEN_MAX: usize = 10_000;

/// Names the record of a call (see [`Engine::key_for`]).
pub(super) fn name(call: Call, policy: &ToolPolicy) -> Result<Option<Named>, EngineError> {
    if policy.kind != ToolKind::Write {
        return Ok(None);
    }
    // Only a call the window names needs it (a scoped one costs a digest).
    let window_fingerprint = call.key.is_none().then(|| call.window_fingerprint());
    let named = match (call.key, policy.fallback_window) {
        (Some(k), _) => Named {
            key: Key::new(call.tenant, call.tool, k),
            rule: call.key_rule,
            keep: Keep::of(call.key_rule, policy),
        },
        (None, Some(_)) => Named {
            key: Key::fallback(
                call.tenant,
                call.tool,
                &window_fingerprint.expect("computed for every call without a key"),
            ),
            rule: KeyRule::Fallback,
            keep: Keep::of(KeyRule::Fallback, policy),
        },
        (None, None) => {
            return Err(EngineError::KeyRequired {
                tool: call.tool.to_string(),
            })
        }
    };
    Ok(Some(named))
}

/// How a wait for a record to leave a state ended.
pub(super) enum Waited {
    /// The record left it: what the wait's last look found (`None`: no record, or one expired).
    /// The caller judges that record as a reservation's answer, rather than reserving again
    /// only to read it anew: after a storm's winner completes, each waiting duplicate then makes
    /// one read instead of a read and a reservation (on Postgres, a read and an insert that
    /// conflicts, then a read). Only an absent record is reserved again.
    Left(Option<Record>),
    /// The deadline passed first.
    TimedOut,
}

pub(super) fn answered(r: Reservation, rule: KeyRule, decision: Decision) -> Begun {
    Begun::Answered(Answer {
        key: Some(r.key),
        rule: Some(rule),
        decision,
    })
}

pub(super) fn executing(r: Reservation, rule: KeyRule, keep: Keep, lease: Lease) -> Begun {
    Begun::Execute(Ticket {
        key: r.key,
        rule,
        lease,
        keep,
        lease_for: r.lease_for,
        fingerprint: Some(r.fingerprint),
    })
}

/// A replay, marked where it is decided (a moment, not a phase: its time is the reservation's).
pub(super) fn replay_span(executed_at: Timestamp) {
    let span = tracing::info_span!(
        target: TRACE_TARGET,
        "idemgate.replay",
        idemgate.executed_at = tracing::field::Empty,
    );
    if !span.is_disabled() {
        span.record("idemgate.executed_at", tracing::field::display(executed_at));
    }
}
