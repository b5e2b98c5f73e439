from devcluster.cli import main

raise SystemExit(main())
