// The typed errors of libmember's replies, and the one table that maps a reply to them (the
// same table as the Python client's errors.py; every reply text is in docs/commands.md).
"use strict";

/** An error reply of the server that libmember names. `message` is the reply as the server
 * sent it (`UNAVAILABLE …`, `ERR no such set…`, `NOPERM …`); `cause` is the client library's
 * own error object. */
class MemberError extends Error {
  constructor(reply, cause) {
    super(reply, { cause });
    this.name = new.target.name;
    /** The server's reply text. */
    this.reply = reply;
  }
}

/** The source of truth could not answer: PostgreSQL is down, unreachable, slower than
 * `member.db-timeout-ms`, or too many clients already wait on it. Never a wrong answer: retry
 * later. A write answered this way may or may not have taken effect; repeating it is safe. */
class Unavailable extends MemberError {
  get retryable() {
    return true;
  }
}

/** The set is not in the catalog: create it with `Sets.create` first. */
class NoSuchSet extends MemberError {
  get retryable() {
    return false;
  }
}

/** The connection's user may not run this command on this set: the module's per-set refusal
 * (needs ACL key permission on `member:<set>`), the server's own `NOPERM`, or a `SOURCE`
 * table the operator's `member.attach-allow` does not list. */
class NoPermission extends MemberError {
  get retryable() {
    return false;
  }
}

/** Reply prefix -> class, checked in order against the whole reply text. */
const REPLY_PREFIXES = [
  ["UNAVAILABLE", Unavailable],
  ["ERR no such set", NoSuchSet],
  ["NOPERM", NoPermission],
  ["ERR SOURCE table is not allowed by member.attach-allow", NoPermission],
];

/** The error reply as the server sent it, from a client library's error: ioredis, iovalkey
 * and node-redis keep it whole in `message`; GLIDE wraps it (`An error was signalled by the
 * server: - ResponseError: no such set…`, or `UNAVAILABLE: source of truth…` for a code it
 * does not know). `null` when `err` is no server reply (a closed connection, a timeout). */
function replyText(err) {
  if (!(err instanceof Error) || typeof err.message !== "string") return null;
  const message = err.message;
  const glide = /^An error was signalled by the server:? -? ?(\w+): ?([\s\S]*)$/.exec(message);
  if (glide) {
    const [, kind, rest] = glide;
    const code = { ResponseError: "ERR", PermissionDenied: "NOPERM", NoPermissionError: "NOPERM" }[kind];
    if (code) return `${code} ${rest}`;
    return rest;
  }
  const extension = /^([A-Z][A-Z_]+): ([\s\S]*)$/.exec(message);
  if (extension && err.constructor && err.constructor.name === "RequestError") {
    return `${extension[1]} ${extension[2]}`;
  }
  return message;
}

/** The typed error for `err` when its reply is one libmember names, otherwise `err` itself. */
function mapError(err) {
  if (err instanceof MemberError) return err;
  const text = replyText(err);
  if (text === null) return err;
  for (const [prefix, Class] of REPLY_PREFIXES) {
    if (text.startsWith(prefix)) return new Class(text, err);
  }
  return err;
}

module.exports = { MemberError, Unavailable, NoSuchSet, NoPermission, REPLY_PREFIXES, mapError, replyText };
