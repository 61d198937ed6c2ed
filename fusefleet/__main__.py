from fusefleet.cli import main

main()
