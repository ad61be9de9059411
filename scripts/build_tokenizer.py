"""Build epp-tiny, the small tokenizer shipped in `epp/tokenize/data/`, offline and deterministically.

    .venv/bin/python scripts/build_tokenizer.py                 # rewrite epp/tokenize/data/
    .venv/bin/python scripts/build_tokenizer.py /tmp/out        # build elsewhere (the test does)

epp-tiny exists so that `epp serve` and the simulator agree on token ids with no configuration. It
is a byte-level BPE (any text tokenizes, nothing maps to `<unk>`) shaped like the tokenizer of the
tiny Llama model the KV-event vectors were captured from: `<unk>`=0, `<s>`=1 (BOS, prepended by
the post-processor, as Llama does), `</s>`=2, `<pad>`=3, and three chat role markers
`<|system|>`=4, `<|user|>`=5, `<|assistant|>`=6 used by its chat template. It is not that model's
tokenizer (whose files are not part of the vectors): the ids of ordinary text differ.

Pre-tokenization: digit runs are cut into groups of at most three (so numbers cost a bounded
number of merges, as in Llama 3), then `tokenizers`' byte-level pre-tokenizer with its GPT-2 split
rule (contractions, letters with one leading space, punctuation runs, whitespace runs).

The corpus is generated here rather than read from disk, so the output depends only on this file
and the `tokenizers` version: no Python-version-dependent stdlib text, no random module (a 64-bit
LCG written out below), no iteration over sets of strings (their order follows the per-process
hash salt). BPE training depends
only on how often each pre-token occurs, so the corpus is not prose: it is words drawn with Zipf
weights (weight 1/(rank + 2)) from two lists, wrapped in sentence punctuation, plus lines of code,
JSON, YAML, Markdown and shell built from templates, so that indentation, brackets and operators
get merges too.
- `GENERAL_WORDS`: about a thousand common English words, written for this script, most frequent
  first (approximately).
- `TECHNICAL_WORDS`: the words (lower-cased, 2-14 letters) found at least 12 times in the
  docstrings and comments of CPython 3.11's standard library (without its tests, encodings,
  idlelib, lib2to3 and pydoc_data) and in Debian's GPL-2, LGPL-2.1 and MPL-2.0 texts, most frequent
  first, minus the general words and contraction fragments. Counted once when this script was
  written; the list is the data, the counting is not repeated.

Measured with tokenizers 0.23.3 on a 2-vCPU VM (tests/tokenize/test_build.py checks the
reproduction): the build takes ~1.5 s, training ~0.5 s of it. Characters per token: English prose
3.9 (text not in the corpus), the GPL-3 text 3.6, this repository's Python 2.9-3.0, its Markdown
1.9-2.6 (box drawings and tables cost a token per byte or two).
"""

from __future__ import annotations

import bisect
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

NAME = "epp-tiny"
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SENTENCES = 30_000  # sentences and code lines: ~1.8 MB of text, ~0.5 s of training
SEED = 20_261_122
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "epp" / "tokenize" / "data"

# Rendered with add_special_tokens=False by whoever applies it (as vLLM does for chat), since the
# template writes the BOS itself. String content only: list-of-parts content is flattened to text
# by vLLM before rendering for a template that never iterates over content.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' + (message['content'] or '') + eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# Templates for code-like lines; {a} {b} {c} are identifiers, {A} a capitalised word, {n} a
# number, {w} a plain word. Indentation is added by the generator.
CODE_TEMPLATES = (
    "def {a}(self, {b}, {c}=None):",
    "def {a}({b}: {A}) -> {A}:",
    "return self.{a}({b}, {c})",
    "return {a}[{n}]",
    "if {a} is None:",
    "if not {a}:",
    "elif {a} == {n}:",
    "else:",
    "for {a} in {b}:",
    "for {a}, {b} in enumerate({c}):",
    "while {a} < {n}:",
    "{a} = {b}.{c}({n})",
    "{a} += {n}",
    "self.{a} = {b}",
    'raise {A}Error(f"{w} {{{a}}}")',
    "except {A}Error as {a}:",
    "try:",
    "import {a}",
    "from {a}.{b} import {A}",
    "class {A}({A}):",
    "# {w} {w} {w} {w}",
    'print("{w} {w}", {a})',
    "{a} = [{n}, {n}, {n}]",
    '{a} = {{"{b}": {n}, "{c}": "{w}"}}',
    '"{a}": "{w} {w}",',
    '"{a}": {n},',
    '"{a}": ["{b}", "{c}"],',
    '{{"{a}": {{"{b}": true, "{c}": null}}}}',
    "{a}:",
    "{a}: {w}",
    "- {a}: {n}",
    "- name: {a}",
    "## {A} {w}",
    "- **{A}**: {w} {w} `{a}`",
    "| {a} | {n} | {w} |",
    "```python",
    "```",
    "$ {a} --{b} {c}",
    "export {A}_{A}={n}",
    '<div class="{a}">{w}</div>',
    "SELECT {a}, {b} FROM {c} WHERE {a} = {n};",
    "const {a} = await {b}.{c}();",
    "function {a}({b}) {{",
    "}}",
    "{a}.{b}({c}, {n});",
    "let {a}: Vec<{A}> = {b}.iter().collect();",
    "// {w} {w} {w}",
)

# Common English, most frequent first (approximately); written for this script.
GENERAL_WORDS = """
the of and to a in is that it for you was on with he as i his be at by this had not are but from or have
an they which one were her all she there would their we him been has when who will no more if out so
said what up its about than into them can only other new some could time these two may then do first any
my now such like our over man me even most made after also did many before must through back years where
much your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three states himself few
house use during without again place around however home small found thought went say part once general
high upon school every does got united left number course war until always away something fact though
water less public put think almost hand enough far took head yet government system better set told
nothing night end why called find going look asked later knew point next program city business give
group toward young days let room president side social present given several order national possible
rather second face per among form important often things looked early white case john become large big
need four within felt along children saw best church ever least power development light thing seemed
family interest want members mind country area others done turned although open god service problem
certain kind different thus began door help sense whole matter perhaps itself york times law human line
above name example action company hands local show whether five history gave today either act feet
across taken past quite anything seen having death experience body word half really week field car words
already themselves information tell together college shall money period held keep sure free real
probably seems behind cannot political air question office making brought whose special heard major
problems ago became federal moment study available known result street economic boy position reason
change south board individual job society areas west close turn love community true court force full
seem am art role age evidence party dark level policy leave short lead market training care six bring
black sort person rest whatever ten mother father food table woman women voice cost believe cases value
front view clear future difficult answer move private data play report control run stood center figure
class child effect price low support rate heart hold team base sound produce fine increase building
decided music simply paper space eyes moved wanted top road near strong hope forward stay girl learning
wall surface model ground pay sat walk north friend provide plan basis town language usually idea nature
minutes include cold speak finally friends stage including remember research energy meeting received red
story allowed return growth test wrong medical material wife letter deep quality recent hour likely
trade natural live worked health chance read beyond whom understand lay window tax needed stand range
lost middle foot student movement average developed feel ready fall design patient hours event method
sometimes physical morning follow foreign blue land region mean outside else according list series
summer century green modern subject higher final picture heavy everything peace leaders writing reached
hear tried watch wish hard easy spring fire cause personal sent evening instead seven particular shown
letters addition necessary beautiful stock questions contract simple popular quickly lines species earth
daughter western born brother attention island doctor hair sea season normal sister pressure daily
trying added soon project carried ask factor involved learn sun financial hot amount science nearly gone
direction ran sign rule risk step source type spent success nine piece vote film director concern
treatment goal garden lack loss similar forms follows theory structure skills feeling wait walked kept
glass dead nation truth teacher charge worth practice parents tree increased decision miss eight
approach network created soft reading scene send dinner sell computer library drive answered clearly
throughout certainly easily bad running mark british english french german american european china japan
india africa london paris monday friday sunday january march april june july september october december
journey village river mountain forest ocean weather rain snow wind storm bridge station train plane ship
hotel restaurant kitchen bedroom coffee tea bread meat fruit breakfast lunch cheese chicken apple milk
sugar salt wine beer nurse hospital disease medicine memory brain smile laugh cry dream sleep wake eat
drink cook wash clean sing dance swim fly ride climb throw catch push pull carry buy sold paid spend
cheap expensive rich poor happy sad angry afraid tired hungry busy quiet loud bright warm cool fresh dry
wet safe dangerous strange famous favorite perfect terrible wonderful amazing ugly funny serious honest
gentle careful lucky pretty please thank thanks sorry hello yes okay maybe rarely recently suddenly
slowly carefully exactly actually especially therefore meanwhile otherwise moreover furthermore
nevertheless unless whereas despite beside beneath below inside towards regarding explain describe
discuss compare analyze summarize translate write rewrite draft review edit improve suggest recommend
consider ensure create generate convert calculate solve respond assist answers task tasks steps examples
detail details summary article essay email message poem paragraph sentence sentences text document
documents title section chapter topic context user assistant customer product account password login
error issue solution fix bug feature request response client server models prompt prompts token tokens
languages translation meaning grammar spelling style tone format bullet chart image images video photo
file files folder link website page online internet software hardware app application phone address
plans schedule meetings projects deadline budget costs sales revenue profit marketing strategy analysis
results database query code function variable loop values string numbers array object key keys output
input tests debug deploy install update version release build script command terminal python java
javascript rust sql html css json yaml api http https url
"""

# Words of CPython 3.11 stdlib docstrings and comments and three licence texts, >= 12 occurrences,
# most frequent first; see the module docstring.
TECHNICAL_WORDS = """
module decimal path default none returns self argument bytes instance arguments header using exception
call current methods directory add specified option tuple false options rfc returned check optional
process objects names encoding non empty mode raise widget note int size thread args package start
strings filename copy socket defined py attribute internal integer single passed dictionary
implementation handle os sys import element characters stack attributes functions dict buffer raised
standard character parse following str parameter named stream connection item protocol classes index
content handler prefix specific sequence parser match interface try modules defaults types log windows
license remove xml keyword block zero length root containing bit print org byte distribution headers
errors info provided ipv raises ignore encoded based flag contains calls host dir frame extension
directories namespace binary allow parent lock compatibility subclass cache port entry queue parameters
unix main utf uses charset except archive init timeout items copyright commands flags compiler mapping
means member target float constructor ascii calling callable compile arg stop id existing original
fields multiple documentation parsing valid elements avoid shared currently exist written width common
override exists foo iso contain platform node spec variables pass instances provides skip relative
matching search distutils tag latin eof access whitespace negative screen directly global reference
replace record extra newline date environment operation offset closed unicode required representation
pep setup color count events callback pickle corresponding sets supplied manager logging helper decode
deprecated def obj resource paths equivalent useful threads ip coroutine zip additional built exit
removed abstract lib locale delete valueerror wrapper mailbox tuples nan pair map matches configuration
generic quoted invalid supported com appropriate hash param enum exceptions display regular transport
trailing assume usage traceback iterable underlying reserved ssl descriptor load logger specifies
pattern abc updated master generator digits chunk greek takes bound encode raw executable contents
supports doctest cookie split complete factory etc mime handlers allows tk break construct previous
associated limit iterator bpo rpc setting implements entries pipe posix messages alias define signal via
operand button changed equal absolute register gnu counter changes initialize versions store implemented
needs cancelled implement correct loader fraction infinity ignored repr compression shutdown syntax
decoded seconds starting msg handling signature libraries references modify opcode dst positive
arbitrary automatically blocks returning unknown separator func accept bar generated determine len terms
representing works append packages blank statement modified canvas extensions possibly actual column
comment specify description max leading scheme compute subclasses config warning pairs literal selection
exponent immediately various platforms caller spaces sr constants notice creates occurs included round
lists initial stdout sub integers filenames imported join fd expression prevent bits trace breakpoint
strip exact missing pathname globals domain select processes reset expected fail conversion requires
maximum rights static proxy explicitly behavior makes custom datetime interpreter location registry
author waiting readline resulting separate status cookies random total temporary precision strict appear
happen algorithm contributor operations parts gets frames condition escape wrapped numeric pyc handles
overridden stored backwards month represents compiled sequences insert addresses boolean distribute
lineno checks executed subprocess conditions creating converted height capital fails indicates extract
omitted ok env extended runtime isolat opened registered considered processing positional io plus starts
permission www tab exc tar cs purpose adds stderr tcl execute checking longer double db comparison
entire docstring memo exp smtp post wrap attempt eg apply decorator followed indicating usr fixed
formatted sorted logical quote bind readable site bin difference yield basic formatting identifier
broken scripts cancel payload dialog metadata authentication browser passing lower audio includes angle
backward compatible intended pop endian font pos boundary delay label comments selected reader cmd
derived accepted diff rules cls heap cyrillic related assert addr inf coordinates widgets replaced
deleted connect debugging bugs hook stuff points dispatch installed dot parsed gives creation
turtlescreen futures sax cursor seek suffix depending ie copies magic lookup runs keyerror component
builtin chunks continue terminated typeerror op blocking requests rounding aix barrier junk cfws active
systems compressed multipart handled threading tix failed dirs normally row described aliases async save
annotations ftp mouse oserror stat doing symlinks execution remaining resources kwargs external opcodes
configure shape ttk wsgi filesystem suitable able treated prior covered uri filter transfer servers
requested perform mac separated copied typically unchanged chars mm larger unique indicate indent attr
foundation beginning remote symlink digit giving ends specification aiff markobject doc virtual actions
printable stdin gzip machine partial sockets recursive counts co divide timezone buffered heading
asyncio dom installation normalize definition determined linux codec bytecode embedded gcc utc
descriptors complex acquire timer frozen ccompiler menu plain invoke fit background testing adding
licensed represent failure sample inherit convenience topmost verbose nodes focus imports symbolic union
checked performance src occur working alive symbol cgi txt replacement remainder properties rounded
dummy typing container fill typ subtype tkinter iff settings require utility fast components correctly
behaviour pre callbacks vars guess reduce tarinfo executor isonum assumed groups flush appended maps
links xc reads tabs agreement sig specifying abs property records defines damages dataclass worker
hostname connections exec appears direct recursively issues receive printed null enter explicit bg
optimization processed psf happens formatter symbols priority msvc depends formats tls enable cached
loaded started desired scope locals subset en ab implied padding upper properly shell drop pending
identical pragma decoder escaped finder loggers legacy fallback copying modification ones connected
looks fullname deal looking nested expand concrete popen quotes tr fixme importlib template completed fl
tries limited finished environ assigned signals ending warnings due ts whenever comparisons af meta
decoding square selector linker iteration prefixes optionally ext circular regex uuid reverse pointer
speed cover imap warranty isotech applications num initialized var interfaces win minus occurred prints
indentation sum cleanup ratio docs anchor finite integral manifest isogrk defects interactive restore
marked crlf successful hack fork semantics debugger th discard inherited del older definitions
instantiate pure programs auto writer ld warranties alert resume fragment pen obs takefocus listed
portion disable codes functionality smaller tools td faster isinstance guaranteed generally asynchronous
invoked sources origin pickling unpickling sections median subsequent validate defect cte argv disabled
lang multi sock anyway displayed third bootstrap searched importerror silently destination cpython
greater writes refer purposes optimize longest controls accepts spawn interpreted bool pid parsers
distributions namespaces rc rollover dnd alternative dicts begin compliant supporting mask duplicate
becomes treat disk slash canonical cell distributed signed unsigned vs ways slashes colon await undo
share collect scheduled xx sending neither owner spam completion web min suppress pack applies encodings
jump iter inserted compared executing yields dotted hierarchy assuming granted implementing urllib
native collection keywords alpha rational li coroutines cancellederror overlapped watcher grid routine
indices cross columns successfully breakpoints latter feed proper ints differences yu consistent chain
expect box cycle reported zipfile terminate metaclass retrieve constant getopt filters macro ast kw
polygon resp choose device security reasons efficient someone entity mappings fileobj closing contained
zone declaration fold structures central mechanism adjust attrs res identified profile graphics nntp
keyed netscape detect statistics pdb fp supply gh getattr fredrik builds previously earlier goes
expanded encountered netmask displays wraps universal newer eq sep features protocols mail auth
superclass consists denominator collections prec tarfile bitmap wheel drawing coordinate fillcolor
quotation pool workers macros session dump skipped mapped regardless weekday digest produces finish
users resolve resolved converts scan destroyed assumes cycles dbm decide proto persistent onto minimum
infinite calculated beta compound de annotation framework secret acquired fun subwidgets opening
responses fault initialization nor demo sysconfig causes preferred cp hashable inputs floats
uncompressed consume undocumented visible compares val compilation ordinary xe newlines recursion tail
bare inet docstrings pydoc runtimeerror levels adjusted tz predicate providing verify certificate
wrapping emit inexact operands quantize slots notify daemon licenses globs visual pencolor arrow circle
labs username fetch super patch overhead race clients ignoring marker dd codecs timestamp corresponds
calendar linear internally warn pointing releases da stripped track nb export legal subtract tells wants
operator poll extend instruction schemes logic backslash core duplicates sqrt typevar subnormal pad seq
functools indirect classvar dll annotated waiter pip contact tagorid mixed quit builtins continuation
replaces unpack respectively normalized says hh printing generates chosen importing gettext incomplete
microsoft released zeros replacing sentinel describing unlike alter makefile namedtuple finalize clock
shift abcs indicated buffers consumed forever fds locks interval significant marks variance opt
representable nonzero scale checker sends profiler distance linking fut cancellation further suite
retrieved permissions precedence lowercase recommended macos unused computed minimal streams crc
changing routines potential nt aware fully merge caught architecture performed escapes timedelta
overflow separators necessarily slice terminator mro easier minor coefficient serve nans liable relevant
parties folding params toplevel returncode typeddict logrecord dos todo snapshot writable browsers
prefer urls alone dependent basename late exe suffixes breaks eval units iterate wikipedia mtime cygwin
management sp slow notes preserve util triple jan helpers redundant identify passes overrides undefined
cut unc flow locked choice barry ellipsis emax unit ordering division ln rotate linked bottom channel
corner semaphore ehlo pixels turtles geometry instantiating mydata entities elementtree tagname phrase
relief subwidget accessed unexpected taking extracted configured patterns rely apis specialized temp
declarations documented rows inline mod operating allowing commonly applied spanish backslashes
independent specifier turns generators approximation uname sha weakref garbage converting applicable
holds fee placed failures obtained possibility warsaw paramspec entirely snan miscellaneous handshake
esmtp tags waitpid curses atom menubutton ms keeps descriptions capabilities lf loading struct
dictionaries mostly sendfile exclude rename hit represented safely remain lundh reasonable tb reporting
expansion meant constructed utilities decorated attempts recognized detected nearest fractions
arithmetic interesting hereby usual encoder avoids accepting unpickler smallest resolution epoch ordered
matched population interpolation places restrictions arising forget layout modifications unlocked ctrl
specifically alphabet checkers lesser pause pixel fws patent bz limits ids uid subdirectories enabled
lambda keeping ss expat outputs tables gmt wiki floating similarly depend kernel sensitive lt trigger
loops notation identifying ver compilers invariant hence finalizer collected exits dec tzinfo prepare
grab localhost mu stamp modulo fitness destroy disposition openssl overriding dist positionals fancy
runner drawn typical defaulting strictly repeat rb reply combine guard consisting unsupported protect
trick introspection additionally completely reject comparing align usable switch bogus getting arabic
indented pseudo depth combination iana nice sync pick typed channels designed closest implies localtime
attached mixin opener cur sec bytearray produced pickled commit sslcontext delta inspect unset
distinguish intermediate topics exited manually sigma occurrence winner originally pax obtain
consequential optionparser generating supposed obsolete tstate recipients dtd testclass logo moves
managed libfoo bdist icon borderwidth foreground notebook theme getitem hooks overview yielding cr char
cfg comes ensures effective clone invocation mozilla variant net truncate overwritten compress
dependency slightly le referenced convention textiowrapper padded responsible buffering ignores
delimiter sh eventually hex capture refers truncated inc collapse ranges contexts arch listen frequency
boundaries placeholder efficiently offsets attach daylight blocked translated lzma dots tcp reuse
subclassed streamreader compliance vinay sajip markup mo probability raising percent overlap popped
preserved propagate rounds branch guarantee mix limitation filled retained assignment comma coro
constructs overridable ns drain helo reports executables extent outline draw pi plat chunked sash closes
incompatible stripping eoferror differ tty console syscall unavailable glob caused shows bzip xz
registers archives stopiteration former conform rgb bytesio reach engine transform parses tested
compiling positions leaving packed concurrent allocated bunch prevents redirect cc aifc repeatedly
operators literals atomic transition callers recognize newly attempted quoting delimiters respect slot
lazy emin offer updates underflow floor numerically quick expressed negligence dest telnet visit
determines terminates claims apache proxies abcd animation resizemode derivative nowait mingw ws
xmlreader dl multicall highlightcolor textvariable fg subparts remains fmt appending std insensitive
mentioned dependencies startup unspecified operate maintain potentially recurse removes debugged entered
stops affect counted plist serialized containers leap lc hmac hexadecimal attributeerror tmp inner
markers category il ru rs ca tracker fn detailed gen discarded prefixlen ietf octet implicit dynamic dev
mutable idle setpos setparams algorithms multiply formal submodule pipes assign binascii pathlib recv
delimited blanks submodules transparent classmethod hidden doctype contributed numerator acute largest
expose prefixed permitted ctx immutable ye validation affected sparse expressions instantiated initially
rushing disclaims regard profits complicated owns pm finders located expires closure notified cv
semaphores bd communicate driven stats subclassing shapes press agent datagram rpm diaeresis isopub
builder packet ep severity tdemo notices pertaining fileno iterables pth venv twice unfortunately
readinto breaking invoking indicator unlink grouping intervals knows preceding tracebacks alternate
pieces networks saved resets anymore issubclass listing sdk xcode sampling weak ref strftime critical
advertising iobase satisfy ahead exclusive caches incoming epoll succeed setstate pushed controlled
presumably situation simplify dynamically indirectly solaris yielded freedom edge essentially vector
maxsize bases whatsoever processor compact gif logged drwxr xr configparser ndiff generation unittest
colormode pensize turtleshape declared msvccompiler wakeup qname oudkerk arena keypress combobox
secondary sqlite hide receiving highest st unsafe cz overwrite ed unable issued triggered yyyy bom
emulate handy triples hashing compresslevel retry ex caching modifier fi glibc ambiguous na subsequently
border managers pow statements searching cpu defining sizes tokenize odd publicity locator existence
advantage pickler machinery appropriately octets streamwriter satisfied identity serving regression
computation helps opts optimized sufficient signaling numerical infinities cleared xor storing
meaningful tortious mainly boxes obvious unregister layer convenient deadlock recipient gamma
doctestrunner completes segments redistribute purepath serialize unixccompiler filelist swig subelements
shr te scrollbar panedwindow keyrelease holder underline tokenlist subpart fileinput cumulative
correspond emitted automatic concatenated interpret dates differs capability gid renamed osx pathnames
mailcap prepend instantiation fs github gz facility manipulate conditional evaluated endings tool
hashlib trivial locations primitive exiting illegal pythonware portable lets az captured oldest
manipulation primarily consecutive somewhere cm fixes guido unmodified reliable installs libc rewind
expects naming microseconds requirement stopped counting timing synch zipinfo inst lots dis const
authors consistency numbering finding wrappers exported horizontal locate contributions ability
covariance intercept decimals computing uniform separating math genericalias occurrences sanity enables
manage acts liability combined published invokes lru reentrant prog ctypes outer cert pyconfig amd iis
leaf colgroup blake elsewhere rawturtle pressed killed dllwrap delegate eventloop notification
circumflex grave comply svr loaders traversable spinbox wm pane appeared
"""


class _Lcg:
    """Knuth's MMIX 64-bit LCG: the same sequence on every machine and Python version."""

    def __init__(self, seed: int) -> None:
        self._state = seed

    def unit(self) -> float:
        """A float in [0, 1) from the top 53 bits of the next state."""
        self._state = (self._state * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        return (self._state >> 11) / 2**53

    def below(self, n: int) -> int:
        return int(self.unit() * n)


class _Words:
    """Draws words with Zipf weights over a ranked list."""

    def __init__(self, words: list[str], rng: _Lcg) -> None:
        self._words = words
        self._cumulative = list(itertools.accumulate(1.0 / (rank + 2) for rank in range(len(words))))
        self._rng = rng

    def word(self) -> str:
        i = bisect.bisect_left(self._cumulative, self._rng.unit() * self._cumulative[-1])
        return self._words[min(i, len(self._words) - 1)]

    def identifier(self) -> str:
        parts = [self.word() for _ in range(1 + self._rng.below(3))]
        if self._rng.unit() < 0.2:
            return parts[0] + "".join(p.capitalize() for p in parts[1:])
        return "_".join(parts)


def _ranked(*lists: str) -> list[str]:
    # dict.fromkeys keeps the first occurrence in order (str hashing never decides order here).
    return list(dict.fromkeys(w for text in lists for w in text.split()))


def _number(rng: _Lcg) -> str:
    return str(rng.below(10 ** (1 + rng.below(5))))


def _sentence(words: _Words, rng: _Lcg) -> str:
    out: list[str] = []
    for i in range(3 + rng.below(22)):
        w = words.word()
        if w == "i":
            w = "I"
        elif i == 0 or rng.unit() < 0.03:
            w = w.capitalize()
        u = rng.unit()
        if u < 0.02:
            w = f"({w})"
        elif u < 0.035:
            w = f'"{w}"'
        elif u < 0.05:
            w = _number(rng)
        elif u < 0.06:
            w += "'s"
        out.append(w)
        if i > 1 and rng.unit() < 0.08:
            out[-1] += ","
    end = rng.unit()
    tail = "." if end < 0.8 else "?" if end < 0.9 else "!" if end < 0.93 else ":"
    return " ".join(out) + tail


def _code_line(words: _Words, rng: _Lcg) -> str:
    template = CODE_TEMPLATES[rng.below(len(CODE_TEMPLATES))]
    line = template.format_map(_Fill(words, rng))
    return "    " * rng.below(4) + line


class _Fill(dict[str, str]):
    """A format_map mapping that draws a fresh value for every placeholder occurrence."""

    def __init__(self, words: _Words, rng: _Lcg) -> None:
        super().__init__()
        self._words = words
        self._rng = rng

    def __missing__(self, key: str) -> str:
        if key in ("a", "b", "c"):
            return self._words.identifier()
        if key == "A":
            return self._words.word().capitalize()
        if key == "n":
            return _number(self._rng)
        return self._words.word()


def corpus() -> Iterator[str]:
    """The training text, in paragraphs of prose or blocks of code lines."""
    rng = _Lcg(SEED)
    words = _Words(_ranked(GENERAL_WORDS, TECHNICAL_WORDS), rng)
    made = 0
    while made < SENTENCES:
        n = 1 + rng.below(8)
        if rng.unit() < 0.7:
            yield " ".join(_sentence(words, rng) for _ in range(n)) + "\n\n"
        else:
            yield "\n".join(_code_line(words, rng) for _ in range(n)) + "\n"
        made += n


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    # After training: the trainer would otherwise put BOS into every training sequence.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, SPECIAL_TOKENS.index(BOS))]
    )
    return tok


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "additional_special_tokens": SPECIAL_TOKENS[4:],
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict[str, object]:
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "additional_special_tokens": SPECIAL_TOKENS[4:],
    }


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": build().to_str(pretty=False) + "\n",
        "tokenizer_config.json": _json(tokenizer_config()),
        "special_tokens_map.json": _json(special_tokens_map()),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8", newline="\n")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"usage: {Path(__file__).name} [OUT_DIR]  (default {DEFAULT_OUT})", file=sys.stderr)
        return 2
    out = Path(argv[0]) if argv else DEFAULT_OUT
    write(out)
    print(f"wrote {NAME} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
