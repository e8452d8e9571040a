// The identity provider the portal's tests sign in through: a real oidc-provider, its clients, accounts and
// test-only defects read from a JSON file at each use, so that a test changes them while it runs.
//
//   node tests/oidc/provider.mjs --port PORT --config FILE
//
// The issuer is http://127.0.0.1:PORT (PORT 0: any free port); once listening it prints `ready <issuer>`.
// FILE holds {"clients": [...], "accounts": {login: {password, claims..., amr, acr}}, "tamper": null | mode,
// "generation": any} (tests/oidc/plugin.py writes it; a new generation is a new test, which replays no ID
// token of an earlier one). Its own pages: /interaction/:uid signs in with a login and a password
// and grants whatever was asked for, without a consent page; /session/end signs out.

import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import { CompactSign, decodeJwt, decodeProtectedHeader, exportJWK, generateKeyPair } from 'jose';
import Provider, { interactionPolicy } from 'oidc-provider';

const { values: options } = parseArgs({ options: { port: { type: 'string' }, config: { type: 'string' } } });
if (options.port === undefined || options.config === undefined) {
  console.error('usage: node tests/oidc/provider.mjs --port PORT --config FILE');
  process.exit(2);
}

const TITLE = 'Test identity provider';
const TAMPERS = new Set(['issuer', 'audience', 'expired', 'signature', 'unsigned', 'replay']);

function settings() {
  return JSON.parse(readFileSync(options.config, 'utf8'));
}

function escape(value) {
  return String(value ?? '').replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>${escape(title)}</title></head>
<body>
<h1>${escape(title)}</h1>
${body}
</body>
</html>`;
}

// The store of everything the provider keeps (sessions, interactions, codes, grants), in this process's
// memory; clients are the exception: read from the file at each lookup, so a redirect URI added later counts.
const store = new Map();
const byGrant = new Map();

class Adapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async find(id) {
    if (this.model === 'Client') {
      const client = (settings().clients ?? []).find((each) => each.client_id === id);
      return client && {
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
        ...client,
      };
    }
    const entry = store.get(this.key(id));
    if (!entry || entry.expires < Date.now()) return undefined;
    return entry.payload;
  }

  async findByUid(uid) {
    for (const [key, { payload }] of store) {
      if (key.startsWith(`${this.model}:`) && payload.uid === uid) return payload;
    }
    return undefined;
  }

  async findByUserCode(userCode) {
    for (const [key, { payload }] of store) {
      if (key.startsWith(`${this.model}:`) && payload.userCode === userCode) return payload;
    }
    return undefined;
  }

  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    store.set(key, { payload, expires: expiresIn ? Date.now() + expiresIn * 1000 : Infinity });
    if (payload.grantId) {
      if (!byGrant.has(payload.grantId)) byGrant.set(payload.grantId, new Set());
      byGrant.get(payload.grantId).add(key);
    }
  }

  async consume(id) {
    const entry = store.get(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    for (const key of byGrant.get(grantId) ?? []) store.delete(key);
    byGrant.delete(grantId);
  }
}

function accountOf(login) {
  const accounts = settings().accounts ?? {};
  return Object.hasOwn(accounts, login) ? accounts[login] : undefined;
}

async function findAccount(ctx, id) {
  const account = accountOf(id);
  if (!account) return undefined;
  return {
    accountId: id,
    async claims() {
      const claims = { sub: id };
      for (const name of ['email', 'email_verified', 'name', 'given_name', 'family_name', 'preferred_username', 'groups']) {
        if (name in account) claims[name] = account[name];
      }
      return claims;
    },
  };
}

async function logoutSource(ctx, form) {
  // The form the provider gives holds its xsrf token; the answer "yes, sign me out" goes inside it, so that a
  // plain HTTP client posts the form as it is, and a browser submits it by itself.
  const confirm = form.replace(
    '</form>',
    '<input type="hidden" name="logout" value="yes"/><button type="submit">Sign out</button></form>',
  );
  ctx.body = page(`${TITLE} — sign out`, `<p>Signing you out …</p>
${confirm}
<script>document.getElementById('op.logoutForm').submit();</script>`);
}

async function postLogoutSuccessSource(ctx) {
  ctx.body = page(`${TITLE} — signed out`, '<p>You are signed out.</p>');
}

async function renderError(ctx, out) {
  ctx.type = 'html';
  const rows = Object.entries(out).map(([key, value]) => `<dt>${escape(key)}</dt><dd>${escape(value)}</dd>`);
  ctx.body = page(`${TITLE} — error`, `<dl>${rows.join('')}</dl>`);
}

const signingKey = await generateKeyPair('RS256', { extractable: true });
const kid = randomBytes(8).toString('hex');
const jwk = { ...(await exportJWK(signingKey.privateKey)), kid, alg: 'RS256', use: 'sig' };
// Another key under the same kid: what `tamper: "signature"` signs with.
const impostorKey = (await generateKeyPair('RS256', { extractable: true })).privateKey;

// The login prompt also asks again where the provider's session holds an account the file no longer has
// (oidc-provider itself fails on it), as a real provider does for a deleted user.
const policy = interactionPolicy.base();
policy.get('login').checks.add(new interactionPolicy.Check(
  'account_removed',
  'the signed-in account no longer exists',
  (ctx) => Boolean(ctx.oidc.session.accountId && !ctx.oidc.account),
));

let providerCallback; // set once the provider exists, which needs the port the server listens on
const server = createServer((req, res) => handle(req, res));
await new Promise((resolve) => server.listen(Number(options.port), '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  adapter: Adapter,
  findAccount,
  jwks: { keys: [jwk] },
  claims: {
    // The authentication's own facts go into every ID token, next to those of the scopes asked for.
    openid: ['sub', 'acr', 'amr', 'auth_time'],
    profile: ['name', 'given_name', 'family_name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  scopes: ['openid', 'profile', 'email', 'groups'],
  conformIdTokenClaims: false,
  responseTypes: ['code'],
  pkce: { required: (ctx, client) => client.clientAuthMethod === 'none' },
  cookies: {
    keys: [randomBytes(32).toString('hex')],
    long: { httpOnly: true, sameSite: 'lax', secure: false },
    short: { httpOnly: true, sameSite: 'lax', secure: false },
  },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true, logoutSource, postLogoutSuccessSource },
  },
  interactions: { policy, url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  renderError,
  ttl: {
    AccessToken: 3600,
    AuthorizationCode: 60,
    Grant: 86400,
    IdToken: 3600,
    Interaction: 3600,
    RefreshToken: 86400,
    Session: 86400,
  },
});
providerCallback = provider.callback();

// --- test-only defects of the token endpoint's ID token --------------------------------------------------
let previous; // {idToken, generation}: the last token response's ID token, as issued

async function resign(idToken, change, key = signingKey.privateKey) {
  const payload = { ...decodeJwt(idToken), ...change };
  return new CompactSign(new TextEncoder().encode(JSON.stringify(payload)))
    .setProtectedHeader(decodeProtectedHeader(idToken))
    .sign(key);
}

async function tampered(idToken, mode, generation) {
  const now = Math.floor(Date.now() / 1000);
  switch (mode) {
    case 'issuer':
      return resign(idToken, { iss: 'http://impostor.example' });
    case 'audience':
      return resign(idToken, { aud: 'another-client' });
    case 'expired':
      return resign(idToken, { iat: now - 7200, exp: now - 3600 });
    case 'signature':
      return resign(idToken, {}, impostorKey);
    case 'unsigned': { // alg "none", the kid kept: no signature at all
      const part = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');
      const header = { ...decodeProtectedHeader(idToken), alg: 'none' };
      return `${part(header)}.${part(decodeJwt(idToken))}.`;
    }
    case 'replay':
      if (previous?.generation !== generation) {
        throw new Error('tamper "replay": no earlier ID token in this test to replay');
      }
      return previous.idToken;
    default:
      throw new Error(`unknown tamper mode ${JSON.stringify(mode)}: one of ${[...TAMPERS].join(', ')}`);
  }
}

provider.use(async (ctx, next) => {
  await next();
  if (ctx.path !== '/token' || ctx.status !== 200 || typeof ctx.body?.id_token !== 'string') return;
  const issued = ctx.body.id_token;
  const { tamper, generation = null } = settings();
  try {
    if (tamper) ctx.body = { ...ctx.body, id_token: await tampered(issued, tamper, generation) };
  } catch (error) {
    console.error(error.message);
    ctx.status = 500;
    ctx.body = { error: 'server_error', error_description: error.message };
  }
  previous = { idToken: issued, generation };
});

// --- the sign-in pages --------------------------------------------------------------------------------------
function loginPage(interaction, { login = '', error = '' } = {}) {
  const hint = login || interaction.params.login_hint || '';
  return page(`${TITLE} — sign in`, `<p>Signing in to <strong>${escape(interaction.params.client_id)}</strong>.</p>
${error ? `<p class="error" role="alert">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(interaction.uid)}" autocomplete="off">
  <label>Login <input name="login" value="${escape(hint)}" required autofocus></label>
  <label>Password <input type="password" name="password" required></label>
  <button type="submit">Sign in</button>
</form>`);
}

async function formBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

// Grants what the client asked for and the account has not yet granted it: no consent page.
async function consent(req, res, interaction) {
  const { prompt: { details }, params, session } = interaction;
  const grant = interaction.grantId
    ? await provider.Grant.find(interaction.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (details.missingOIDCScope) grant.addOIDCScope(details.missingOIDCScope.join(' '));
  if (details.missingOIDCClaims) grant.addOIDCClaims(details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(details.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: interaction.grantId ? {} : { grantId } }, {
    mergeWithLastSubmission: true,
  });
}

async function signIn(req, res, interaction) {
  const form = await formBody(req);
  const login = form.get('login') ?? '';
  const account = accountOf(login);
  if (!account || account.password !== (form.get('password') ?? '')) {
    send(res, 200, loginPage(interaction, { login, error: 'Unknown login or wrong password.' }));
    return;
  }
  const result = { login: { accountId: login, amr: account.amr ?? ['pwd'] } };
  if (account.acr) result.login.acr = account.acr;
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

async function interact(req, res) {
  const interaction = await provider.interactionDetails(req, res);
  const { name } = interaction.prompt;
  if (name === 'consent') {
    await consent(req, res, interaction);
  } else if (name !== 'login') {
    send(res, 400, page(`${TITLE} — error`, `<p>Unknown prompt ${escape(name)}.</p>`));
  } else if (req.method === 'POST') {
    await signIn(req, res, interaction);
  } else {
    send(res, 200, loginPage(interaction));
  }
}

function send(res, status, html) {
  res.writeHead(status, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
  res.end(html);
}

function handle(req, res) {
  if (req.url === '/favicon.ico') { // what a browser asks every site for: nothing, and no error
    res.writeHead(204);
    res.end();
    return;
  }
  if (/^\/interaction\/[^/?]+(\?|$)/.test(req.url)) {
    interact(req, res).catch((error) => {
      console.error(error);
      send(res, 400, page(`${TITLE} — error`, `<p>${escape(error.message)}</p>`));
    });
    return;
  }
  if (providerCallback) {
    providerCallback(req, res);
  } else {
    send(res, 503, page(`${TITLE} — starting`, '<p>Starting.</p>'));
  }
}

provider.on('server_error', (ctx, error) => console.error('server_error', error));
console.log(`ready ${issuer}`);
