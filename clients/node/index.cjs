'use strict';
const native = require('./native.cjs');
const engine = require('./engine.cjs');
const errors = require('./errors.cjs');

module.exports = {
  Engine: engine.Engine,
  Result: engine.Result,
  idempotent: engine.idempotent,
  currentKey: engine.currentKey,
  deriveKey: native.deriveKey,
  mintKey: native.mintKey,
  checkKey: native.checkKey,
  fingerprint: native.fingerprint,
  IdemgateError: errors.IdemgateError,
  BadRequest: errors.BadRequest,
  KeyRequired: errors.KeyRequired,
  NotFound: errors.NotFound,
  KeyReused: errors.KeyReused,
  Conflict: errors.Conflict,
  InFlight: errors.InFlight,
  OutcomeUnknown: errors.OutcomeUnknown,
  OutcomeExpired: errors.OutcomeExpired,
  LeaseLost: errors.LeaseLost,
  NotResolvable: errors.NotResolvable,
  RateLimited: errors.RateLimited,
  QuotaExceeded: errors.QuotaExceeded,
  StoreUnavailable: errors.StoreUnavailable,
  StoreMisconfigured: errors.StoreMisconfigured,
  OutcomeNotRecorded: errors.OutcomeNotRecorded,
  NotApplied: errors.NotApplied,
  Failed: errors.Failed,
  MaybeApplied: errors.MaybeApplied,
};
