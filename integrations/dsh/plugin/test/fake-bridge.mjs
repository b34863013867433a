#!/usr/bin/env node
// A strict stand-in for tavern-bridge: answers the handshake and every call but `prompt`,
// which it never answers (a bridge stuck in a hostile search, as issue 30 saw). Anything it
// does not know is an error frame, so the plugin cannot rely on a call the real bridge lacks.
import { appendFileSync } from 'node:fs'
import { createInterface } from 'node:readline'

const lines = createInterface({ input: process.stdin })
const send = (frame) => process.stdout.write(JSON.stringify(frame) + '\n')
// Its command line, for tests that check the flags the plugin passes.
if (process.env.FAKE_BRIDGE_LOG) appendFileSync(process.env.FAKE_BRIDGE_LOG, JSON.stringify({ argv: process.argv.slice(2) }) + '\n')
lines.on('line', (line) => {
  const frame = JSON.parse(line)
  if (frame.id == null) return
  switch (frame.method) {
    case 'handshake':
      return send({ id: frame.id, result: { tools: [{ name: 'tavern_lore_search', description: 'lore', parameters: {}, outputSchema: {} }] } })
    case 'agent/created':
      // What the plugin asked for, for tests that check the binding it sends.
      if (process.env.FAKE_BRIDGE_LOG) appendFileSync(process.env.FAKE_BRIDGE_LOG, JSON.stringify(frame.params) + '\n')
      // A character with no card, as the real bridge refuses it with `--assets`.
      if (frame.params?.bind?.character === 'Mirra') {
        return send({ id: frame.id, error: { code: 'runtime', message: 'no new chat of "Mirra": no card of that name among the assets' } })
      }
      return send({ id: frame.id, result: { bound: true } })
    case 'shutdown':
      send({ id: frame.id, result: { ok: true } })
      return process.exit(0)
    case 'prompt':
      return // never answered
    case 'api/request':
      // A path naming `stall` is never answered (a bridge stuck on one request).
      if (String(frame.params?.path).includes('/stall')) return
      // Echoes what the plugin forwarded, as the API would answer it.
      return send({ id: frame.id, result: { status: 200, contentType: 'application/json', body: JSON.stringify({ forwarded: frame.params }) } })
    default:
      return send({ id: frame.id, error: { code: 'invalid', message: `unknown method ${frame.method}` } })
  }
})
