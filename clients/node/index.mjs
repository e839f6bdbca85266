// The ESM entry point: the CommonJS module's exports, so both share one engine and one set of
// error classes (an `instanceof` holds whichever way the package was loaded).
import idemgate from './index.cjs';

export const {
  Engine, Result, idempotent, currentKey, deriveKey, mintKey, checkKey, fingerprint,
  IdemgateError, BadRequest, KeyRequired, NotFound, KeyReused, Conflict, InFlight,
  OutcomeUnknown, OutcomeExpired, LeaseLost, NotResolvable, RateLimited, QuotaExceeded, StoreUnavailable,
  StoreMisconfigured, OutcomeNotRecorded, NotApplied, Failed, MaybeApplied,
} = idemgate;
export default idemgate;
