#!/usr/bin/env python3
"""translate.py FILE.cu: prints FILE.cu with every kernel launch `name<<<grid, block, shared, stream>>>(args)` written
as `emulator_launch(dim3(grid), dim3(block), stream, [&] { name(args); })` (stream 0 when the launch names none),
the one piece of CUDA syntax that C++ lacks.
The CUDA emulator (cuda_runtime.h here) gives everything else a meaning on the CPU."""
import sys


def split_top_level(text):
    """The comma-separated parts of text, commas inside brackets kept."""
    parts, depth, current = [], 0, ''
    for ch in text:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(current.strip())
            current = ''
        else:
            current += ch
    parts.append(current.strip())
    return parts


def translate(source):
    out, at = [], 0
    while True:
        start = source.find('<<<', at)
        if start < 0:
            out.append(source[at:])
            return ''.join(out)
        name_start = start
        while name_start > 0 and (source[name_start - 1].isalnum() or source[name_start - 1] == '_'):
            name_start -= 1
        config_end = source.find('>>>', start)
        config = split_top_level(source[start + 3:config_end])
        if len(config) < 2 or source[config_end + 3] != '(':
            sys.exit('translate.py: cannot read the launch at offset %d' % start)
        depth, end = 0, config_end + 3
        while True:
            depth += {'(': 1, ')': -1}.get(source[end], 0)
            if depth == 0:
                break
            end += 1
        arguments = source[config_end + 4:end]
        out.append(source[at:name_start])
        stream = config[3] if len(config) > 3 else '0'
        out.append('emulator_launch(dim3(%s), dim3(%s), %s, [&] { %s(%s); })'
                   % (config[0], config[1], stream, source[name_start:start], arguments))
        at = end + 1


if __name__ == '__main__':
    with open(sys.argv[1]) as f:
        sys.stdout.write(translate(f.read()))
