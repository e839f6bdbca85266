// What counts as "the same action", as one table of cases every Node door is held to (the
// rule itself is the kit's, `idemgate_kit::identity`, through the addon's `nameAction`).
// `stamp(door)` registers the cases as tests of one door, driven through its real framework and
// that framework's own fake model with the adapter's default options, counting the side effects
// (mails sent); a case a door cannot have is marked in the door's `impossible` with the reason
// (shown in the test output and in the table, never skipped in silence). `table(doors)` renders
// the README's table from the same data (test/readme.test.mjs checks they agree).
//
// A door is `{ name, conversation, impossible, open(options) }`: `conversation` says what the door
// takes for a conversation; `open({ key })` (a business key function, else nothing) resolves to
// `{ sent(), conversation() }`, where `conversation().turn(calls)` is one turn of a new
// conversation's model, which calls `send_email` once per entry of `calls` in order (`{ id,
// args }`, or a function of the texts read so far that returns one) and resolves to the texts the
// model read back. `id` is the framework's tool-call id. `open({ ttl })` gives the tool that
// policy.
import { test } from 'node:test';
import assert from 'node:assert/strict';

export const MAIL = Object.freeze({ to: 'ann@example.com', subject: 'invoice' });

/** What the model reads for a call taken for a re-emission of an identical one. */
const REPEAT = /idemgate: an identical call of this tool .* was not run again/;
/** What the model reads for a call taken for a re-plan of an action its identity fields name. */
const REPLAN = /idemgate: an action of this tool with the same to, subject \(the arguments that name it.* was not run again/;
/** What the model reads for any answer that did not run the tool now. */
const TOLD = /idemgate: /;
/** What the model reads for a retry after the TTL (the kit's words for an expired outcome): it
 * ran at T, was not performed again, its result is no longer kept, and how to do it on purpose. */
const EXPIRED =
  /idemgate: This action was already performed at \S+, and its result is no longer kept \(it expired at \S+\), so it was NOT performed again.*idempotency_key set to a new value/s;

/** The TTL of the expired case, in seconds, and how long its retry waits: past the TTL (a timer
 * waiting for time itself: the record expires by the clock; its tombstone, 30 days by default,
 * remembers it). */
const TTL = 0.3;
const PAST_TTL_MS = 700;

const call = (id, extra = {}) => ({ id, args: { ...MAIL, ...extra } });

/** Runs `turn` and says how many mails it sent. */
async function counted(world, turn) {
  const before = world.sent();
  const texts = await turn();
  return { texts, sent: world.sent() - before };
}

export const CASES = [
  {
    id: 'resent',
    what: 'the same call id sent again in the conversation',
    want: '1',
    async run(door) {
      const w = await door.open();
      const texts = await w.conversation().turn([call('call-1'), call('call-1')]);
      assert.equal(w.sent(), 1, texts.join('\n'));
    },
  },
  {
    id: 'reemitted',
    what: 'the identical call under a new id in one conversation',
    want: '1, the model told',
    async run(door) {
      const w = await door.open();
      const texts = await w.conversation().turn([call('call-1'), call('call-2')]);
      assert.equal(w.sent(), 1, texts.join('\n'));
      assert.doesNotMatch(texts[0], TOLD);
      assert.match(texts[1], REPEAT);
    },
  },
  {
    id: 'replanned',
    what: "a re-plan under a new id: the same `to` and `subject` (the tool's `identity`), the body reworded",
    want: '1, the model told which fields named it',
    async run(door) {
      const w = await door.open({ identity: ['to', 'subject'] });
      const texts = await w.conversation().turn([
        call('call-1', { body: 'Hello Ann, your invoice is attached.' }),
        call('call-2', { body: 'Dear Ann, please find the invoice attached.' }),
      ]);
      assert.equal(w.sent(), 1, texts.join('\n'));
      assert.doesNotMatch(texts[0], TOLD);
      assert.match(texts[1], REPLAN);
    },
  },
  {
    id: 'two-conversations',
    what: 'the same arguments and a constant call id in two conversations',
    want: '2',
    async run(door) {
      const w = await door.open();
      for (const n of [1, 2]) {
        const [text] = await w.conversation().turn([call('call_0')]);
        assert.equal(w.sent(), n, text);
        assert.doesNotMatch(text, TOLD);
      }
    },
  },
  {
    id: 'deliberate',
    what: 'a deliberate repeat, done as the notice says',
    want: '2',
    async run(door) {
      const w = await door.open();
      const asTold = (texts) => {
        // "... call the tool again with the argument idempotency_key set to a new value ..."
        const [, argument] = texts[1].match(/with the argument (\w+) set to a new value/) ?? [];
        assert.ok(argument, texts[1]);
        return call('call-3', { [argument]: 'second-mail' });
      };
      const texts = await w.conversation().turn([call('call-1'), call('call-2'), asTold]);
      assert.match(texts[1], REPEAT);
      assert.doesNotMatch(texts[2], TOLD);
      assert.equal(w.sent(), 2, texts.join('\n'));
    },
  },
  {
    id: 'business-key',
    what: "a business key (the program's `key`) across conversations",
    want: '1, the model told',
    async run(door) {
      const w = await door.open({ key: () => 'order-7' });
      await w.conversation().turn([call('call-1')]);
      const [text] = await w.conversation().turn([call('call-9')]);
      assert.equal(w.sent(), 1, text);
      assert.match(text, TOLD);
    },
  },
  {
    id: 'reused',
    what: "a call id or the model's own key reused for a new action in a later turn",
    want: '2, or a replay the model is told of (never silent)',
    async run(door) {
      const w = await door.open();
      const c = w.conversation();
      for (const extra of [{}, { idempotency_key: 'mail-1' }]) {
        await c.turn([call('call-1', extra)]);
        // The user asks for the same mail once more; the model reuses the id (or its key).
        const later = await counted(w, () => c.turn([call('call-1', extra)]));
        assert.ok(later.sent === 1 || TOLD.test(later.texts[0]), `a silent replay: ${later.texts[0]}`);
      }
    },
  },
  {
    id: 'expired',
    what: 'a retry after the TTL (`ttl: 0.3`; the same call in a later turn)',
    want: 'not run, told expired',
    async run(door) {
      const w = await door.open({ ttl: TTL });
      const c = w.conversation();
      const [first] = await c.turn([call('call-1')]);
      await new Promise((resolve) => setTimeout(resolve, PAST_TTL_MS));
      // The turn retried once the TTL has passed: the same call, under the same id, again.
      const [retry] = await c.turn([call('call-1')]);
      assert.equal(w.sent(), 1, retry);
      assert.doesNotMatch(first, TOLD);
      assert.match(retry, EXPIRED);
    },
  },
];

/** Registers every case as a test of `door`. */
export function stamp(door) {
  for (const c of CASES) {
    const reason = door.impossible?.[c.id];
    const name = `${door.name}: ${c.what}: ${c.want}`;
    if (reason) test(name, { skip: `not possible: ${reason}` }, () => {});
    else test(name, () => c.run(door));
  }
}

/** The table of `doors` as README.md shows it: each case and what every door does (✓: as
 * wanted, tested; a numbered note: not possible, and why), then what each door takes for a
 * conversation. */
export function table(doors) {
  const row = (cells) => `| ${cells.join(' | ')} |`;
  const notes = [];
  const cell = (door, c) => {
    const reason = door.impossible?.[c.id];
    if (!reason) return '✓';
    notes.push(`${notes.length + 1}. ${door.name}, ${c.what}: not possible: ${reason}.`);
    return `no (${notes.length})`;
  };
  const rows = CASES.map((c) => row([c.what, c.want, ...doors.map((d) => cell(d, c))]));
  return [
    row(['case (default options)', 'wanted', ...doors.map((d) => d.name)]),
    row(['---', '---', ...doors.map(() => '---')]),
    ...rows,
    '',
    ...notes,
    '',
    'What each door takes for the conversation:',
    '',
    ...doors.map((d) => `- ${d.name}: ${d.conversation}.`),
  ].join('\n');
}

/** The Node doors the suite is stamped for (their drivers: test/same-action.test.mjs). */
export const DOORS = {
  ai: {
    name: 'AI SDK',
    conversation: "the tool context's `conversationId`, else the message objects the SDK hands the tool (the same in every step and in later calls given the history)",
  },
  agents: {
    name: 'OpenAI Agents JS',
    conversation: "`runContext.context.conversationId`, else the run (its RunContext); a later turn is a new run",
    impossible: {
      expired: 'a later turn is a new run, another conversation, so the retried call runs again (2 mails), and the SDK never invokes a call id twice in one run; name the conversation (the next column)',
    },
  },
  agentsNamed: {
    name: 'OpenAI Agents JS, `conversationId` in the run context',
    conversation: "`runContext.context.conversationId`, the program's (`run(agent, input, { context: { conversationId } })`): every run of the conversation",
  },
  langchain: {
    name: 'LangChain.js',
    conversation: '`configurable.thread_id` (LangGraph), or `metadata.thread_id`/`session_id`/`conversation_id`',
  },
  langchainBare: {
    name: 'LangChain.js, no conversation id',
    conversation: 'none: a tool is handed no run either, so each call is its own invocation',
    impossible: {
      resent: 'each call is its own invocation, so it runs again (2 mails); name the conversation or pass `scope`',
      reemitted: 'each call is its own invocation, never joined to another (2 mails); name the conversation or pass `scope`',
      replanned: 'each call is its own invocation, so there is no window to compare identity fields in (2 mails); name the conversation or pass `scope`',
      deliberate: 'there is no notice to follow: nothing is taken for a repeat without a conversation',
      expired: 'each call is its own invocation, so the retry runs again (2 mails), as any re-sent call does; name the conversation or pass `scope`',
    },
  },
  mcpCallIds: {
    name: 'MCP TS gate, call ids in `_meta`',
    conversation: '`_meta["dev.idemgate/conversation"]` beside the call id in `_meta["dev.idemgate/tool-call-id"]` (as `idemgate mcp` reads them): the call id names the action within it, with the window, under the default policy',
  },
  mcp: {
    name: 'MCP TS gate (tool `window` set)',
    conversation: '`_meta["dev.idemgate/conversation"]`, else the MCP session, else the stdio connection; a request id is never a key, and without the `window` a call with no key is refused',
    impossible: {
      expired: 'a call with no key is named by the re-emission window alone, whose records keep no tombstone: within the window the retry is a replay the model is told of (1 mail), after it a new action; a key (`_meta`, the model\'s, the program\'s `key`) is answered expired',
    },
  },
};
