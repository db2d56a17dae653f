// Calls sluice's bsky.Service the way the AT Protocol AppView calls its
// data plane: connect-es v1, a gRPC transport over HTTP/2, no compression,
// and an interceptor naming the caller in x-atlantis-caller (the AppView's
// packages/bsky/src/data-plane/client). The Go test next to this file
// starts a seeded sluice and passes its addresses and seeded records in
// the JSON file named by SLUICE_APPVIEW_FIXTURE.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { MethodKind } from "@bufbuild/protobuf";
import { Code, ConnectError, createPromiseClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { CID } from "multiformats/cid";
import { jsonToLex, lexicons } from "@atproto/api";
import { Service } from "./gen/bsky/bsky_connect.js";
import { GetLikeRecordsRequest, GetLikeRecordsResponse } from "./gen/bsky/bsky_pb.js";
import { Records } from "./gen/sluice/v1/sluice_connect.js";

const fixture = JSON.parse(readFileSync(process.env.SLUICE_APPVIEW_FIXTURE, "utf8"));
const CALLER = "appview";

const callerInterceptor = (caller) => (next) => (req) => {
  req.header.set("x-atlantis-caller", caller);
  return next(req);
};

const transport = createGrpcTransport({
  baseUrl: fixture.grpcUrl,
  httpVersion: "2",
  acceptCompression: [],
  nodeOptions: { rejectUnauthorized: true },
  interceptors: [callerInterceptor(CALLER)],
});
const client = createPromiseClient(Service, transport);
// The write path of the bsky.Service collections (not the AppView's; the
// test feeds records and takedowns in through it).
const records = createPromiseClient(Records, transport);

const decode = (bytes) => JSON.parse(new TextDecoder().decode(bytes));

// assertLexiconValid checks a returned record against its collection's
// lexicon, as the AppView validates each record it parses (its
// parseRecord, after lexParseJsonBytes). The record's JSON form is what
// sluice stores and returns; it is decoded into the lexicon's data model
// (blob refs, $link, $bytes) first. The synthetic seeded posts and likes
// are not checked: they are sized for the benchmarks, with texts over the
// lexicon's 300 graphemes and placeholder strong-ref CIDs, so the AppView
// would drop them; the records the tests write here are lexicon-valid.
function assertLexiconValid(collection, bytes, what) {
  const json = decode(bytes);
  try {
    lexicons.assertValidRecord(collection, jsonToLex(json));
  } catch (err) {
    assert.fail(`${what} is not a valid ${collection} record: ${err.message}\n${JSON.stringify(json)}`);
  }
}

// What the meta of a post must say, computed here from its JSON, apart
// from sluice's own derivation.
function expectedMeta(post) {
  const embed = post.embed?.$type === "app.bsky.embed.recordWithMedia" ? post.embed.media : post.embed;
  return {
    isReply: post.reply != null,
    hasMedia: embed?.$type === "app.bsky.embed.images",
    hasVideo: embed?.$type === "app.bsky.embed.video",
  };
}

async function rejectsWith(promise, code, pattern) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof ConnectError, `want a ConnectError, got ${err}`);
    assert.equal(Code[err.code], Code[code], `code of ${err.rawMessage}`);
    if (pattern) assert.match(err.rawMessage, pattern);
    return true;
  });
}

test("seeded posts are found, parse as app.bsky.feed.post JSON, and carry meta", async () => {
  const uris = fixture.posts.map((p) => p.uri);
  const res = await client.getPostRecords({ uris });
  assert.equal(res.records.length, uris.length);
  assert.equal(res.meta.length, uris.length);
  const seen = { isReply: 0, hasMedia: 0, hasVideo: 0 };
  res.records.forEach((rec, i) => {
    const want = fixture.posts[i];
    const post = decode(rec.record);
    assert.equal(post.$type, "app.bsky.feed.post", `records[${i}]`);
    assert.deepEqual(post, JSON.parse(want.json), `records[${i}] body`);
    assert.equal(rec.cid, want.cid, `records[${i}] cid`);
    // The AppView drops a record whose cid does not parse (parseRecord).
    assert.equal(CID.parse(rec.cid).toString(), rec.cid, `records[${i}] cid parses`);
    assert.equal(rec.createdAt.toDate().toISOString(), new Date(want.createdAt).toISOString());
    assert.ok(rec.indexedAt.toDate() >= rec.createdAt.toDate(), `records[${i}] indexedAt`);
    assert.equal(rec.sortedAt.toDate().getTime(), rec.createdAt.toDate().getTime());
    assert.equal(rec.takenDown, false);
    const meta = expectedMeta(post);
    assert.deepEqual(
      { isReply: res.meta[i].isReply, hasMedia: res.meta[i].hasMedia, hasVideo: res.meta[i].hasVideo },
      meta,
      `meta[${i}]`,
    );
    for (const k of Object.keys(seen)) seen[k] += meta[k] ? 1 : 0;
  });
  for (const [k, n] of Object.entries(seen)) assert.ok(n > 0, `no seeded post has ${k}; the meta check is weak`);
});

test("a missing URI gives an empty record at its position", async () => {
  const [a, b] = fixture.posts;
  const uris = [a.uri, fixture.missing[0], b.uri, fixture.likes[0].uri];
  const res = await client.getPostRecords({ uris });
  assert.equal(res.records.length, 4);
  assert.equal(decode(res.records[0].record).text, JSON.parse(a.json).text);
  assert.equal(res.records[1].record.length, 0, "missing post");
  assert.equal(res.records[1].cid, "");
  assert.equal(decode(res.records[2].record).text, JSON.parse(b.json).text);
  assert.equal(res.records[3].record.length, 0, "a like's URI is not a post");
  assert.deepEqual([res.meta[1].isReply, res.meta[1].hasMedia, res.meta[1].hasVideo], [false, false, false]);
});

test("a 20,000-URI batch gets InvalidArgument", async () => {
  const uris = Array.from({ length: 20_000 }, (_, i) => fixture.posts[i % fixture.posts.length].uri);
  await rejectsWith(client.getPostRecords({ uris }), Code.InvalidArgument, /20000 uris exceeds the limit of 1000/);
});

test("odd URIs in a 50-URI batch are answered as missing, the other 46 correctly", async () => {
  const odd = {
    3: "at://alice.example.com/app.bsky.feed.post/3kabc",
    17: "at://did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK/app.bsky.feed.post/3kabc",
    30: `${fixture.posts[0].uri}?x=1`,
    44: `at://did:web:${"h".repeat(50)}.test/app.bsky.feed.post/${"k".repeat(512)}`,
  };
  assert.equal(odd[44].length, 600);
  const want = [];
  let next = 1;
  const uris = Array.from({ length: 50 }, (_, i) => {
    if (odd[i]) {
      want.push(null);
      return odd[i];
    }
    want.push(fixture.posts[next]);
    return fixture.posts[next++].uri;
  });
  const res = await client.getPostRecords({ uris });
  assert.equal(res.records.length, 50);
  res.records.forEach((rec, i) => {
    if (!want[i]) {
      assert.equal(rec.record.length, 0, `records[${i}] (${uris[i].slice(0, 60)}) is missing`);
      assert.equal(rec.cid, "");
      return;
    }
    assert.deepEqual(decode(rec.record), JSON.parse(want[i].json), `records[${i}]`);
    assert.equal(rec.cid, want[i].cid);
  });
});

test("likes and profiles come from their own methods", async () => {
  const likes = await client.getLikeRecords({ uris: fixture.likes.map((l) => l.uri).concat(fixture.posts[0].uri) });
  fixture.likes.forEach((want, i) => {
    const like = decode(likes.records[i].record);
    assert.equal(like.$type, "app.bsky.feed.like");
    assert.equal(likes.records[i].cid, want.cid);
    assert.ok(CID.parse(likes.records[i].cid));
  });
  assert.equal(likes.records.at(-1).record.length, 0, "a post's URI is not a like");
  const profiles = await client.getProfileRecords({ uris: [fixture.profile.uri] });
  assert.equal(decode(profiles.records[0].record).$type, "app.bsky.actor.profile");
  assertLexiconValid("app.bsky.actor.profile", profiles.records[0].record, "the profile");
});

test("methods sluice does not serve answer Unimplemented", async () => {
  // GetActors is a bsky.Service method sluice's proto does not declare;
  // describe it here as the AppView's generated code does.
  const actors = {
    typeName: "bsky.Service",
    methods: { getActors: { name: "GetActors", I: GetLikeRecordsRequest, O: GetLikeRecordsResponse, kind: MethodKind.Unary } },
  };
  await rejectsWith(createPromiseClient(actors, transport).getActors({}), Code.Unimplemented);
});

// Sums the samples of a metric whose labels include want.
function sample(text, name, want) {
  let total = 0;
  let found = false;
  for (const line of text.split("\n")) {
    const m = line.match(/^(\w+)\{(.*)\} (\S+)$/);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(want).every(([k, v]) => labels[k] === v)) {
      total += Number(m[3]);
      found = true;
    }
  }
  return found ? total : undefined;
}

test("the caller appears as a client in /metrics", async () => {
  const text = await (await fetch(fixture.metricsUrl)).text();
  const ok = sample(text, "sluice_requests_total", { client: CALLER, service: "bsky.Service", method: "GetPostRecords", code: "OK" });
  assert.ok(ok >= 2, `sluice_requests_total for ${CALLER} GetPostRecords OK = ${ok}`);
  const refused = sample(text, "sluice_rejections_total", { client: CALLER, method: "GetPostRecords", reason: "shape" });
  assert.ok(refused >= 1, `shape rejections for ${CALLER} = ${refused}`);
  const items = sample(text, "sluice_items_total", { client: CALLER, method: "GetLikeRecords" });
  assert.ok(items >= fixture.likes.length, `items for ${CALLER} GetLikeRecords = ${items}`);
});

// Records written through sluice.v1.Records, as a test post of did with rkey.
const ALICE = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
const BOB = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
const CAROL = "did:plc:cccccccccccccccccccccccc";
const at = (did, collection, rkey) => `at://${did}/${collection}/${rkey}`;
const POST = "app.bsky.feed.post";
const ref = (uri) => ({ uri, cid: fixture.posts[0].cid });
function rec(did, collection, rkey, body = {}) {
  const json = { $type: collection, createdAt: "2026-01-01T00:00:00Z", ...body };
  return { uri: at(did, collection, rkey), cid: fixture.posts[0].cid, record: new TextEncoder().encode(JSON.stringify(json)) };
}
const post = (did, rkey, body = {}) => rec(did, POST, rkey, { text: "t", ...body });

test("takedowns, tags and gate state written through sluice.v1.Records", async () => {
  const gated = at(BOB, POST, "3kgated000000");
  const quoted = at(BOB, POST, "3kquoted00000");
  const taken = { ...post(ALICE, "3ktaken000000"), takedownRef: "mod:1", tags: ["hide", "rank:-1"] };
  const reply = post(CAROL, "3kreply000000", { reply: { root: ref(gated), parent: ref(gated) } });
  const quote = post(CAROL, "3kquote000000", { embed: { $type: "app.bsky.embed.record", record: ref(quoted) } });
  const written = await records.putRecords({
    records: [
      taken,
      rec(BOB, "app.bsky.feed.threadgate", "3kgated000000", { post: gated, allow: [] }),
      post(BOB, "3kgated000000"),
      reply,
      rec(BOB, "app.bsky.feed.postgate", "3kquoted00000", { post: quoted, embeddingRules: [{ $type: "app.bsky.feed.postgate#disableRule" }] }),
      post(BOB, "3kquoted00000"),
      quote,
    ],
  });
  assert.equal(written.written, 7);
  const uris = [taken.uri, gated, reply.uri, quoted, quote.uri];
  let res = await client.getPostRecords({ uris });
  assert.equal(res.records[0].takenDown, true);
  assert.equal(res.records[0].takedownRef, "mod:1");
  assert.deepEqual(res.records[0].tags, ["hide", "rank:-1"]);
  const flags = (m) => [m.hasThreadGate, m.violatesThreadGate, m.hasPostGate, m.violatesEmbeddingRules];
  assert.deepEqual(res.meta.map(flags), [
    [false, false, false, false],
    [true, false, false, false],
    [false, true, false, false],
    [false, false, true, false],
    [false, false, false, true],
  ]);
  for (const r of res.records.slice(1)) assert.equal(r.takenDown, false);
  res.records.forEach((r, i) => assertLexiconValid(POST, r.record, `written post ${uris[i]}`));

  const lifted = await records.updateTakedowns({ takedowns: [{ uri: taken.uri, takedownRef: "" }] });
  assert.equal(lifted.updated, 1);
  res = await client.getPostRecords({ uris: [taken.uri] });
  assert.equal(res.records[0].takenDown, false);
  assert.equal(res.records[0].takedownRef, "");
  assert.deepEqual(res.records[0].tags, ["hide", "rank:-1"]);
});

test("op_threads are filled when include_op_thread_metadata is set", async () => {
  const root = post(ALICE, "3kroot0000000");
  const first = post(ALICE, "3kop100000000", { reply: { root: ref(root.uri), parent: ref(root.uri) } });
  const second = post(ALICE, "3kop200000000", { reply: { root: ref(root.uri), parent: ref(first.uri) } });
  await records.putRecords({ records: [root, first, second] });
  const asked = await client.getPostRecords({ uris: [second.uri], includeOpThreadMetadata: true });
  assert.equal(asked.opThreads.length, 1);
  assert.equal(asked.opThreads[0].rootUri, root.uri);
  assert.deepEqual(asked.opThreads[0].uris, [root.uri, first.uri, second.uri]);
  const unasked = await client.getPostRecords({ uris: [second.uri] });
  assert.equal(unasked.opThreads.length, 0);
});

test("standard.site documents and publications, by URI and by ref", async () => {
  const DOC = "site.standard.document";
  const PUB = "site.standard.publication";
  const pub = rec(CAROL, PUB, "3kpub00000000", { url: "https://blog.example.com", name: "Blog" });
  const doc = rec(CAROL, DOC, "3kdoc00000000", { site: pub.uri, title: "t", publishedAt: "2026-01-01T00:00:00.000Z" });
  await records.putRecords({ records: [pub, doc] });
  const byUri = await client.getSiteStandardRecordsByURI({ uris: [doc.uri, at(CAROL, DOC, "3kmissing0000"), fixture.posts[0].uri] });
  assert.deepEqual(byUri.documents.map((d) => d.ref.uri), [doc.uri]);
  assert.deepEqual(byUri.publications.map((p) => [p.ref.uri, p.ref.cid]), [[pub.uri, pub.cid]]);
  assert.equal(decode(byUri.documents[0].record.record).site, pub.uri);
  const byRef = await client.getSiteStandardRecordsByRef({ refs: [{ uri: doc.uri, cid: doc.cid }, { uri: pub.uri, cid: "bafyother" }] });
  assert.deepEqual(byRef.documents.map((d) => d.record.cid), [doc.cid]);
  assert.equal(byRef.publications.length, 0);
});
