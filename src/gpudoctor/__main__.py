from gpudoctor.cli.main import main

main()
