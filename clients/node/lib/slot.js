// The cluster hash slot of a routing argument, as the server computes it (src/model/slot.rs):
// CRC16-XMODEM of the key, or of its {hash tag}, mod 16384. Pure; no client library needed.
"use strict";

const SLOTS = 16384;

/** CRC16-XMODEM (polynomial 0x1021, initial 0): entry `b` is the CRC of the one byte `b`. */
const TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    t[i] = crc;
  }
  return t;
})();

/** CRC16-XMODEM of `bytes` (a Uint8Array). */
function crc16(bytes) {
  let crc = 0;
  for (const b of bytes) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ b) & 0xff];
  return crc;
}

/** The bytes that are hashed: those between the first `{` and the first `}` after it when
 * at least one byte lies between them, otherwise the whole key. */
function hashedPart(key) {
  const open = key.indexOf(0x7b);
  if (open >= 0) {
    const close = key.indexOf(0x7d, open + 1);
    if (close > open + 1) return key.subarray(open + 1, close);
  }
  return key;
}

/** The bytes of a routing argument: a Buffer or Uint8Array as given, anything else as the
 * UTF-8 of its string form (what every client sends for a string or a number). */
function bytesOf(key) {
  if (key instanceof Uint8Array) return key;
  return Buffer.from(String(key), "utf8");
}

/** The hash slot of `key` (string, number, Buffer or Uint8Array), 0..16383: what
 * `CLUSTER KEYSLOT` answers for the same bytes. */
function keyslot(key) {
  return crc16(hashedPart(bytesOf(key))) & (SLOTS - 1);
}

const ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
let tags = null;

/** A short ASCII key whose slot is `slot` (a `{tag}`, as src/model/slot.rs makes them): for a
 * client that routes only by a text key, when the routing argument is bytes that are not
 * text. The table of one tag per slot is made once, at the first call. */
function keyForSlot(slot) {
  if (tags === null) {
    tags = new Array(SLOTS);
    let missing = SLOTS;
    const visit = (prefix, depth) => {
      for (const c of ALPHABET) {
        if (missing === 0) return;
        const tag = prefix + c;
        if (depth === 1) {
          const s = keyslot(tag);
          if (tags[s] === undefined) {
            tags[s] = `{${tag}}`;
            missing--;
          }
        } else visit(tag, depth - 1);
      }
    };
    for (let len = 1; missing > 0; len++) visit("", len);
  }
  return tags[slot];
}

module.exports = { SLOTS, crc16, keyslot, keyForSlot };
