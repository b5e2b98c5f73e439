from common.leave import leave
from nodeagent.wiring.cli import main

leave(main())
