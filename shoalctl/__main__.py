from shoalctl.cli import main

raise SystemExit(main())
