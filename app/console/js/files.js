// Verify a file: an export bundle or a single receipt, dropped on the page or chosen, verified entirely in this
// browser (no request leaves the page), as `olu verify FILE` does offline.
import { checkList, verdict } from './checks.js';
import { fill, h } from './dom.js';
import { JSONError, parseStrict } from './jcs.js';
import { rememberedKeys } from './monitor.js';
import { verifyFileText } from './verify.js';

const decoder = new TextDecoder('utf-8', { fatal: true });

export function renderVerifyFile(main) {
  const remembered = rememberedKeys();
  let keysFile = null;
  const out = h('div', { id: 'file-result', 'aria-live': 'polite' });
  const choice = (value, text, checked, disabled = false) => h('label', { class: 'radio' },
    h('input', { type: 'radio', name: 'trust', value, checked, disabled }), ' ', text);
  const keysInput = h('input', { type: 'file', id: 'keys-file', accept: '.json,application/json' });
  const trust = h('fieldset', { class: 'trust' }, h('legend', { text: 'Keys to trust' }),
    choice('remembered', remembered ? `the public keys this browser remembered from the service (${remembered.length})`
      : 'the public keys this browser remembered from the service (none yet: sign in once)', Boolean(remembered), !remembered),
    choice('bundle', 'the public keys inside the bundle (as olu verify without --keys: a forged bundle can bring its own keys)', !remembered),
    h('label', { class: 'radio' }, h('input', { type: 'radio', name: 'trust', value: 'file' }), ' a keys file (a GET /v1/keys answer): ', keysInput));
  keysInput.addEventListener('change', async () => {
    keysFile = keysInput.files[0] ? await readText(keysInput.files[0]) : null;
    trust.querySelector('input[value=file]').checked = true;
  });
  const fileInput = h('input', { type: 'file', id: 'bundle-file', accept: '.json,application/json' });
  const zone = h('div', { class: 'dropzone', id: 'dropzone', tabindex: '0' },
    h('strong', { text: 'Drop an export bundle or a receipt (JSON) here' }), h('br'), 'or choose one: ', fileInput);
  const run = async (file) => {
    const mode = trust.querySelector('input[name=trust]:checked').value;
    let keys = null;
    let keysNote = 'the keys inside the bundle';
    try {
      if (mode === 'remembered') { keys = remembered; keysNote = 'the keys remembered from the service'; }
      if (mode === 'file') {
        if (!keysFile) throw new Error('choose a keys file first');
        keys = parseStrict(keysFile, { python: true });
        keysNote = 'the keys file';
      }
      const text = await readText(file);
      const { report } = await verifyFileText(text, keys);
      show(out, file.name, report.checks, keysNote);
    } catch (e) {
      const why = e instanceof JSONError ? `the file is not strict JSON: ${e.message}`
        : e instanceof TypeError ? 'the file is not UTF-8 text' : e.message;
      show(out, file.name, [{ check: 'file', ok: false, detail: why }], keysNote);
    }
  };
  fileInput.addEventListener('change', () => { if (fileInput.files[0]) run(fileInput.files[0]); });
  zone.addEventListener('dragover', (e) => { e.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (e) => {
    e.preventDefault();
    zone.classList.remove('over');
    const file = e.dataTransfer && e.dataTransfer.files[0];
    if (file) run(file);
  });
  fill(main, 
    h('h1', { text: 'Verify a file' }),
    h('p', { class: 'muted', text: 'The file is read and verified in this browser only: nothing is sent anywhere. '
      + 'The checks are those of olu verify: canonical form, key, Ed25519 signature, signed checkpoint, Merkle inclusion, '
      + 'erasure terms and commitments, and a consistency proof when the bundle has one.' }),
    trust, zone, out);
}

async function readText(file) {
  return decoder.decode(await file.arrayBuffer());  // a UTF-8 byte-order mark is dropped, as Python does for bytes
}

function show(out, name, checks, keysNote) {
  const failed = checks.filter((c) => !c.ok);
  fill(out, 
    h('h2', {}, 'Result for ', h('code', { text: name })),
    verdict(checks, 'VERIFIED', 'NOT VERIFIED'),
    h('p', { class: 'muted', text: `Trusted: ${keysNote}.` }),
    failed.length ? [h('h3', { text: 'Failed checks' }), checkList(failed, { id: 'file-failures' })] : null,
    h('details', { open: failed.length === 0 && checks.length <= 40 }, h('summary', { text: `All ${checks.length} checks` }),
      checkList(checks, { id: 'file-checks' })));
}
