#!/usr/bin/env python3
"""Checks the relative links of Markdown files: the file must exist and a #anchor
must name a heading (GitHub slugs) or an <a id> in it. Prints each broken link.

    python3 docs/check-links.py README.md docs/*.md docs/*/*.md
"""
import os, re, sys
def slug(h):
    h = re.sub(r'<[^>]+>', '', h).strip().lower()
    h = re.sub(r'[^\w\- ]', '', h)   # GitHub: drop punctuation except - and _
    return h.replace(' ', '-')
def anchors(path):
    out = set(); seen = {}; fence = False
    for l in open(path, encoding='utf-8'):
        if l.startswith('```'): fence = not fence
        if fence: continue
        m = re.match(r'(#{1,6}) (.*)', l.rstrip('\n'))
        if m:
            s = slug(m.group(2)); n = seen.get(s, 0); seen[s] = n + 1
            out.add(s if n == 0 else f'{s}-{n}')
        for a in re.findall(r'<a (?:id|name)="([^"]+)"', l): out.add(a)
    return out
bad = 0
for f in sys.argv[1:]:
    fence = False
    for i, l in enumerate(open(f, encoding='utf-8'), 1):
        if l.startswith('```'): fence = not fence
        if fence or l.startswith('    '): continue
        for t in re.findall(r'\]\(([^)\s]+)\)', l):
            if re.match(r'[a-z]+:', t): continue
            path, _, frag = t.partition('#')
            tgt = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(tgt):
                print(f'{f}:{i}: {t}: no such file'); bad += 1
            elif frag and tgt.endswith('.md') and frag not in anchors(tgt):
                print(f'{f}:{i}: {t}: no heading #{frag} in {tgt}'); bad += 1
print(f'{bad} broken'); sys.exit(1 if bad else 0)
