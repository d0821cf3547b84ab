#!/usr/bin/env node
// The official OpenAI client (npm package `openai`, pinned in
// tests/serve/node/package.json, installed by deploy/install-deps.sh) against
// a running `shoal serve` on the bundled model:
//   - models.list names the model; models.retrieve gives the model object it
//     lists; of an unknown id it is the client's NotFoundError (code
//     model_not_found)
//   - completions.create, whole and streamed: the greedy text equals
//     `shoal run --greedy --no-echo`, usage and finish_reason as OpenAI's
//   - chat.completions.create, whole and streamed (with include_usage): the
//     greedy reply equals `shoal run --greedy --no-bos` on the prompt
//     `shoal template` renders
//   - a wrong API key is the client's AuthenticationError (401,
//     code invalid_api_key); a bad field is its BadRequestError (400, param
//     named); a prompt over the context is a BadRequestError with code
//     context_length_exceeded
//   - the API's edges (issue 28): a conversation whose assistant message has
//     tool_calls and content null is served; a role OpenAI does not know, a
//     response_format json_object/json_schema and completions echo: true are
//     BadRequestErrors naming the field; a repeated prompt reports
//     usage.prompt_tokens_details.cached_tokens, whole and streamed
// Run by tests/serve/test_clients.py, which starts the server with --api-key.
//
// usage: node test_openai_client.mjs --base-url http://127.0.0.1:PORT
//            --api-key KEY --shoal build-test/coordinator/shoal --model DIR
// Exits 0 when every check passes, 1 when one fails, 77 when the `openai`
// package is not installed (the wrapper reports a skip).
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2)
    args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['base-url', 'api-key', 'shoal', 'model']) {
    if (!args[k]) {
        console.error(`usage: node test_openai_client.mjs --base-url URL --api-key KEY ` +
                      `--shoal PATH --model DIR (missing --${k})`);
        process.exit(2);
    }
}

// The package lives in tests/serve/node/node_modules, not on the ESM search
// path of this file: resolve it from there (its CommonJS entry).
let OpenAI;
try {
    OpenAI = createRequire(new URL('./node/package.json', import.meta.url))('openai').OpenAI;
} catch (e) {
    console.log(`SKIP: the npm package openai is not installed (deploy/install-deps.sh): ${e.message}`);
    process.exit(77);
}

let checks = 0;
const fails = [];
function check(cond, what) {
    checks++;
    if (!cond) {
        fails.push(what);
        console.log('FAIL:', what);
    }
}

const SHOAL_ENV = { ...process.env, OMP_WAIT_POLICY: 'passive' };

// shoal run's greedy continuation of prompt (stdout without the newline that
// precedes the timings line)
function shoalRun(prompt, maxTokens, ...extra) {
    const out = execFileSync(args.shoal, ['run', '--model', args.model, '--no-echo', '--prompt',
                                          prompt, '--max-tokens', String(maxTokens),
                                          '--threads', '2', '--greedy', ...extra],
                             { env: SHOAL_ENV, encoding: 'utf8', timeout: 120000,
                               stdio: ['ignore', 'pipe', 'pipe'] });
    if (!out.endsWith('\n'))
        throw new Error(`shoal run output does not end in a newline: ${JSON.stringify(out)}`);
    return out.slice(0, -1);
}

const MODEL_ID = 'shakespeare-moe';
const client = new OpenAI({ baseURL: args['base-url'] + '/v1', apiKey: args['api-key'],
                            maxRetries: 0, timeout: 120000 });

async function testModels() {
    const page = await client.models.list();
    check(page.data.length === 1 && page.data[0].id === MODEL_ID,
          `models.list names the model: ${JSON.stringify(page.data)}`);
    const m = await client.models.retrieve(MODEL_ID);
    check(m.id === MODEL_ID && m.object === 'model' && m.owned_by === page.data[0].owned_by &&
          m.created === page.data[0].created,
          `models.retrieve gives the listed model object: ${JSON.stringify(m)}`);
    try {
        await client.models.retrieve('no-such-model');
        check(false, 'models.retrieve of an unknown id fails');
    } catch (e) {
        check(e instanceof OpenAI.NotFoundError && e.status === 404 &&
              e.code === 'model_not_found' && /no-such-model/.test(e.message),
              `models.retrieve of an unknown id: NotFoundError 404 model_not_found naming it ` +
              `(${e.constructor.name} ${e.status} ${e.code}: ${e.message})`);
    }
}

async function testCompletions() {
    for (const [prompt, n] of [['ROMEO:', 40], ['To be, or not to be', 25]]) {
        const want = shoalRun(prompt, n);
        const r = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: n,
                                                    temperature: 0 });
        check(r.object === 'text_completion' && r.id.startsWith('cmpl-') && r.model === MODEL_ID,
              `completion envelope: ${r.object} ${r.id} ${r.model}`);
        check(r.choices.length === 1 && r.choices[0].text === want,
              `completions.create equals shoal run --greedy for ${JSON.stringify(prompt)}:\n` +
              `${JSON.stringify(r.choices[0]?.text)}\n${JSON.stringify(want)}`);
        check(r.choices[0].finish_reason === 'length', 'finish_reason length at max_tokens');
        check(r.usage.completion_tokens === n && r.usage.prompt_tokens >= 1 &&
              r.usage.total_tokens === r.usage.prompt_tokens + n,
              `completion usage: ${JSON.stringify(r.usage)}`);

        const stream = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: n,
                                                         temperature: 0, stream: true });
        let text = '', nChunks = 0, finish = [];
        for await (const ch of stream) {
            nChunks++;
            text += ch.choices[0].text;
            finish.push(ch.choices[0].finish_reason);
        }
        check(text === want, `streamed completion equals shoal run's: ${JSON.stringify(text)}`);
        check(nChunks > 5, `streamed in many chunks (${nChunks})`);
        check(finish.at(-1) === 'length' && finish.slice(0, -1).every((f) => f === null),
              `only the last chunk has a finish_reason: ${JSON.stringify(finish.slice(-3))}`);
    }
}

async function testChat() {
    const system = 'You are a poet.', user = 'Speak of the moon.';
    const rendered = execFileSync(args.shoal, ['template', '--model', args.model, '--system',
                                               system, '--user', user, '--add-generation-prompt'],
                                  { env: SHOAL_ENV, encoding: 'utf8', timeout: 60000 });
    check(rendered.includes(user), `shoal template renders the conversation: ${JSON.stringify(rendered)}`);
    const want = shoalRun(rendered, 30, '--no-bos');
    const messages = [{ role: 'system', content: system }, { role: 'user', content: user }];
    const r = await client.chat.completions.create({ model: MODEL_ID, messages,
                                                     max_completion_tokens: 30, temperature: 0 });
    const c = r.choices[0];
    check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-'),
          `chat envelope: ${r.object} ${r.id}`);
    check(c.message.role === 'assistant', `chat reply role ${c.message.role}`);
    if (c.finish_reason === 'length')
        check(c.message.content === want, 'chat.completions.create equals shoal run on the ' +
              `rendered prompt:\n${JSON.stringify(c.message.content)}\n${JSON.stringify(want)}`);
    else
        check(c.finish_reason === 'stop' && c.message.content && want.startsWith(c.message.content),
              `a chat reply that stopped (${c.finish_reason}) is a non-empty prefix of shoal run's: ` +
              JSON.stringify(c.message.content));

    const stream = await client.chat.completions.create({
        model: MODEL_ID, messages, max_tokens: 30, temperature: 0, stream: true,
        stream_options: { include_usage: true } });
    let text = '', roles = [], usage = null, finish = null;
    for await (const ch of stream) {
        check(ch.object === 'chat.completion.chunk', `chunk object ${ch.object}`);
        if (ch.usage)
            usage = ch.usage;
        if (!ch.choices.length)
            continue;
        const d = ch.choices[0].delta;
        if (d.role)
            roles.push(d.role);
        text += d.content ?? '';
        finish = ch.choices[0].finish_reason ?? finish;
    }
    check(roles.length === 1 && roles[0] === 'assistant', `one role delta: ${roles}`);
    check(text === c.message.content, `streamed chat equals the whole reply: ${JSON.stringify(text)}`);
    check(finish === c.finish_reason, `streamed finish_reason ${finish}`);
    check(usage && usage.completion_tokens === r.usage.completion_tokens &&
          usage.prompt_tokens === r.usage.prompt_tokens,
          `the usage chunk matches the whole reply's: ${JSON.stringify(usage)}`);
}

async function expectError(what, Cls, status, fn, more) {
    try {
        await fn();
        check(false, `${what}: the request fails`);
    } catch (e) {
        check(e instanceof Cls && e.status === status,
              `${what}: ${Cls.name} ${status}, got ${e.constructor.name} ${e.status}: ${e.message}`);
        if (more)
            more(e);
    }
}

async function testErrors() {
    const body = { model: MODEL_ID, prompt: 'ROMEO:', max_tokens: 2, temperature: 0 };
    const wrong = new OpenAI({ baseURL: args['base-url'] + '/v1', apiKey: args['api-key'] + 'x',
                               maxRetries: 0, timeout: 60000 });
    await expectError('a wrong API key', OpenAI.AuthenticationError, 401,
                      () => wrong.completions.create(body),
                      (e) => check(e.code === 'invalid_api_key', `401 code ${e.code}`));
    await expectError('a wrong API key (chat)', OpenAI.AuthenticationError, 401,
                      () => wrong.chat.completions.create(
                          { model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }] }));
    await expectError('temperature out of range', OpenAI.BadRequestError, 400,
                      () => client.completions.create({ ...body, temperature: 1000 }),
                      (e) => check(e.param === 'temperature' && e.type === 'invalid_request_error',
                                   `400 names the field: param ${e.param}, type ${e.type}`));
    await expectError('max_tokens of the wrong type', OpenAI.BadRequestError, 400,
                      () => client.completions.create({ ...body, max_tokens: 'ten' }),
                      (e) => check(e.param === 'max_tokens', `400 param ${e.param}`));
    await expectError('messages without a role', OpenAI.BadRequestError, 400,
                      () => client.chat.completions.create({ model: MODEL_ID,
                                                             messages: [{ content: 'hi' }] }),
                      (e) => check(e.param === 'messages[0].role', `400 param ${e.param}`));
    await expectError('a prompt over the context', OpenAI.BadRequestError, 400,
                      () => client.completions.create({ ...body, prompt: 'ROMEO: '.repeat(300) }),
                      (e) => check(e.code === 'context_length_exceeded' && /256/.test(e.message),
                                   `context error: code ${e.code}, ${e.message}`));
    const r = await client.completions.create(body);
    check(r.choices[0].text.length > 0, 'the server serves after the client errors');
}

async function testToolCallNull() {
    const call = { id: 'call_1', type: 'function',
                   function: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
    const messages = [{ role: 'user', content: 'Weather in Paris?' },
                      { role: 'assistant', content: null, tool_calls: [call] },
                      { role: 'tool', tool_call_id: 'call_1', content: '18 C' }];
    const r = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 3,
                                                     temperature: 0 });
    const same = await client.chat.completions.create({
        model: MODEL_ID, max_tokens: 3, temperature: 0,
        messages: [messages[0], { ...messages[1], content: '' }, messages[2]] });
    check(r.choices[0].message.role === 'assistant' &&
          r.usage.prompt_tokens === same.usage.prompt_tokens,
          `a tool call with content null is served, as content "" in the bundled template ` +
          `(${r.usage.prompt_tokens} vs ${same.usage.prompt_tokens} prompt tokens)`);
}

async function testRefusals() {
    const chat = { model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    await expectError('role wizard', OpenAI.BadRequestError, 400,
                      () => client.chat.completions.create(
                          { ...chat, messages: [{ role: 'wizard', content: 'hi' }] }),
                      (e) => check(e.param === 'messages[0].role' && /'wizard'/.test(e.message),
                                   `400 names the role: param ${e.param}, ${e.message}`));
    await expectError('a user message with content null', OpenAI.BadRequestError, 400,
                      () => client.chat.completions.create(
                          { ...chat, messages: [{ role: 'user', content: null }] }),
                      (e) => check(e.param === 'messages[0].content',
                                   `400 param ${e.param}: ${e.message}`));
    for (const rf of [{ type: 'json_object' },
                      { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } }])
        await expectError(`response_format ${rf.type}`, OpenAI.BadRequestError, 400,
                          () => client.chat.completions.create({ ...chat, response_format: rf }),
                          (e) => check(e.param === 'response_format' &&
                                       e.message.includes(rf.type),
                                       `400 param ${e.param}: ${e.message}`));
    await expectError('completions echo: true', OpenAI.BadRequestError, 400,
                      () => client.completions.create({ model: MODEL_ID, prompt: 'ROMEO:',
                                                        max_tokens: 2, echo: true }),
                      (e) => check(e.param === 'echo', `400 param ${e.param}: ${e.message}`));
    const text = await client.chat.completions.create({ ...chat, response_format: { type: 'text' } });
    check(text.choices.length === 1, 'response_format text is served');
}

async function testCachedTokens() {
    // a repeated prompt: its tokens come from the slot's KV cache
    const prompt = 'JULIET: ' + 'O Romeo, Romeo, wherefore art thou Romeo? '.repeat(2);
    await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 2 });
    const again = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 2 });
    const n = again.usage.prompt_tokens_details?.cached_tokens;
    check(n >= 10 && n < again.usage.prompt_tokens,
          `a repeated prompt: usage.prompt_tokens_details.cached_tokens ${n} of ` +
          `${again.usage.prompt_tokens}`);
    const stream = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 2,
                                                     stream: true,
                                                     stream_options: { include_usage: true } });
    let usage = null;
    for await (const ch of stream)
        usage = ch.usage ?? usage;
    check(usage?.prompt_tokens_details?.cached_tokens >= 10,
          `streamed: the usage chunk's cached_tokens: ${JSON.stringify(usage)}`);
}

for (const [name, fn] of [['models', testModels], ['completions', testCompletions],
                          ['chat', testChat], ['errors', testErrors], ['tool call, content null', testToolCallNull],
                          ['refusals', testRefusals], ['cached tokens', testCachedTokens]]) {
    try {
        await fn();
    } catch (e) {
        check(false, `${name}: unexpected ${e.constructor.name}: ${e.stack}`);
    }
}
console.log(`test_openai_client: ${checks} checks, ${fails.length} failed`);
process.exit(fails.length ? 1 : 0);
