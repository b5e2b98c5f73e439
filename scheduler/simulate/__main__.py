from scheduler.simulate.cli import main

raise SystemExit(main())
