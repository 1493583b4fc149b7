from jobsched.cli import main

main()
