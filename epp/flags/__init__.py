"""Every command-line flag in one home: `epp serve`'s, and the argparse types all subcommands use.

- `serve`: `add_serve_arguments`, epp serve's own flag groups, and their shared defaults;
- `compat`: the flags of GIE's and llm-d Router's EPP that epp has no own name for (logging,
  leader election, metrics auth, ...), and the checks of what epp cannot do with them;
- `kv_events`, `request_limits`: two flag groups of their own;
- `types`: the argparse types (Go durations and booleans, sizes, ports, counts).

Subcommands import from here (`from epp import flags`), never from `epp.cli`, which imports them
all (an import-linter contract keeps it so).
"""

from epp.flags.serve import DEFAULT_DRAIN_DELAY_S as DEFAULT_DRAIN_DELAY_S
from epp.flags.serve import DEFAULT_DRAIN_S as DEFAULT_DRAIN_S
from epp.flags.serve import DEFAULT_RESPONSE_SAMPLE_MIN_INTERVAL_S as DEFAULT_RESPONSE_SAMPLE_MIN_INTERVAL_S
from epp.flags.serve import DEFAULT_RESPONSE_SAMPLE_RATIO as DEFAULT_RESPONSE_SAMPLE_RATIO
from epp.flags.serve import add_serve_arguments as add_serve_arguments
from epp.flags.types import boolean as boolean
from epp.flags.types import byte_size as byte_size
from epp.flags.types import duration as duration
from epp.flags.types import go_bool as go_bool
from epp.flags.types import model_length as model_length
from epp.flags.types import non_negative_float as non_negative_float
from epp.flags.types import port_number as port_number
from epp.flags.types import positive_float as positive_float
from epp.flags.types import positive_int as positive_int
from epp.flags.types import ratio as ratio
from epp.flags.types import workers_count as workers_count
