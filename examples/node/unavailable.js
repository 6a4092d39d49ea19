// libmember's one retryable error: `Unavailable` (a reply starting with UNAVAILABLE) means
// PostgreSQL (the source of truth) did not answer in time. The module never guesses a 0 or 1
// instead, so the call may simply be tried again; every other error is final. Retrying an ADD
// is safe: a second ADD of a member answers false.
const { Unavailable } = require("libmember");

/** Whether `err` is libmember's retryable UNAVAILABLE reply. */
function isUnavailable(err) {
  return err instanceof Unavailable;
}

/** Runs `call` (a function returning a promise), again after UNAVAILABLE, at most `tries` times. */
async function retrying(call, tries = 3, delayMs = 200) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      if (!isUnavailable(err) || attempt === tries) throw err;
      console.error(`${err.message}: try ${attempt + 1} of ${tries} in ${delayMs * attempt} ms`);
      await new Promise((resolve) => setTimeout(resolve, delayMs * attempt));
    }
  }
}

module.exports = { isUnavailable, retrying };
